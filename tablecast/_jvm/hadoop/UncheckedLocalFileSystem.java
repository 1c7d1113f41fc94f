package tablecast.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * The local file system without checksum side files: what a tablecast session uses for
 * file:// checkpoints. Hadoop's RawLocalFileSystem does the same, but it is not a
 * LocalFileSystem, and RocksDB's state snapshots upload through
 * FileSystem.copyFromLocalFile, which casts the file:// file system to one: on the raw
 * one every snapshot failed. Without checksums a checkpoint file is one file and its
 * rename one rename(2), which a kill -9 cannot split.
 */
public final class UncheckedLocalFileSystem extends LocalFileSystem {
    public UncheckedLocalFileSystem() {
        super();
        setWriteChecksum(false);
        setVerifyChecksum(false);
    }
}
