// One-screen sample: type the server, the CA pin and a pairing code, pair, and the worker runs
// the device when the phone is charging, idle and on Wi-Fi. Its samples are bundled digits.
plugins { id("com.android.application") }

android {
    namespace = "org.fedsdk.sample"
    compileSdk = 34
    defaultConfig {
        applicationId = "org.fedsdk.sample"
        minSdk = 26
        targetSdk = 34
        ndk { abiFilters += listOf("arm64-v8a") }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
}

dependencies { implementation(project(":fedsdk")) }
