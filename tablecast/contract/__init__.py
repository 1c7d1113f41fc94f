"""The record contract: what the pipeline writes to Kafka and nodes, stores and clients
read back. Positions, the index header and its order-preserving value codec, windowed
keys, the partitioner and a table's description. Pure data and functions: every other
package may import it, and it imports none of them.
"""
