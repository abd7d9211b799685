//! C ABI: DynamoRIO's drpttracer API and drpttracer_ext_* extensions.
