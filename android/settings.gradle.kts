// The fedsdk Android library module and its one-screen sample app (docs/android.md).
// Not built in this repository's CI (no Android SDK/NDK here); the commands are in docs/android.md.
pluginManagement {
    repositories { google(); mavenCentral(); gradlePluginPortal() }
}
dependencyResolutionManagement {
    repositories { google(); mavenCentral() }
}
rootProject.name = "fedsdk-android"
include(":fedsdk", ":sample")
