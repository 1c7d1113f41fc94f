package dev.tablecast.peers;

import java.util.Map;
import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.Cache;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;

/**
 * One block cache of a bounded size shared by every RocksDB store of the instance, as the Kafka
 * Streams documentation's "bounded memory" config setter does; the size in MiB comes from the
 * system property {@code iq.block.cache.mb} (default 16). Used to measure reads of a table much
 * larger than its caches: {@code --prop rocksdb.config.setter=dev.tablecast.peers.BoundedBlockCache}.
 */
public final class BoundedBlockCache implements RocksDBConfigSetter {
  private static final long BYTES = Long.getLong("iq.block.cache.mb", 16L) << 20;

  /** Made on first use: Kafka Streams instantiates the setter before RocksDB's library loads. */
  private static final class Shared {
    static {
      RocksDB.loadLibrary();
    }

    static final Cache CACHE = new LRUCache(BYTES);
  }

  @Override
  public void setConfig(String storeName, Options options, Map<String, Object> configs) {
    BlockBasedTableConfig table = (BlockBasedTableConfig) options.tableFormatConfig();
    table.setBlockCache(Shared.CACHE);
    // index and filter blocks count against the cache too, as in tablecast's stores
    table.setCacheIndexAndFilterBlocks(true);
    options.setTableFormatConfig(table);
  }

  @Override
  public void close(String storeName, Options options) {
    // the cache is shared by every store and lives as long as the process
  }
}
