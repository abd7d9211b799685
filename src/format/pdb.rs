//! DynamoRIO's per-thread kernel syscall file (`<tid>.raw.pt`, PT Data Buffers).
