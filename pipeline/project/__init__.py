"""What every room stands on: the watches file, where a project keeps its instance and
warehouse, how an expected failure is worded, and the warehouse resource runs share."""
