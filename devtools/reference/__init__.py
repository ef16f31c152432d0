"""The reference pages of the docs, generated from the code: flags from the command-line parsers, metrics from
what a node serves, alerts from the generated rule files, and benchmarks from the results as data."""
