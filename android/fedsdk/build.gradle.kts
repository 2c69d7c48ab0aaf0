// The library an app adds: the Java binding of device_java/ (shared source, the same classes the
// host-JVM test runs), a WorkManager worker, and the JNI library for arm64-v8a.
plugins { id("com.android.library") }

android {
    namespace = "org.fedsdk.android"
    compileSdk = 34
    ndkVersion = "26.3.11579264"
    defaultConfig {
        minSdk = 26
        ndk { abiFilters += listOf("arm64-v8a") }
        externalNativeBuild {
            cmake {
                arguments += listOf(
                    "-DEXECUTORCH_ANDROID_DIR=${property("fedsdk.executorchAndroidDir")}",
                    "-DFEDSDK_NATIVE_DEPS=${property("fedsdk.nativeDepsDir")}",
                    "-DANDROID_STL=c++_shared",
                )
            }
        }
    }
    externalNativeBuild { cmake { path = file("src/main/cpp/CMakeLists.txt") } }
    sourceSets["main"].java.srcDirs("src/main/java", "../../device_java/src")
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
}

dependencies {
    implementation("androidx.work:work-runtime:2.9.1")
    // ExecuTorch's Android runtime (libexecutorch.so with XNNPACK and the optimized kernels).
    implementation("org.pytorch:executorch-android:0.7.0")
}
