"""The pipeline: the App's DSL, its plan, and the compiler to Spark Structured Streaming."""
