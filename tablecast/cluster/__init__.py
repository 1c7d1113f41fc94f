"""The cluster side of a serving node: which partitions it holds, and keeping them current."""
