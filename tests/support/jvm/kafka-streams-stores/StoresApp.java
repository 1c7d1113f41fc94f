import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * A Kafka Streams application with the three kinds of state store, for tests that serve
 * their changelogs: per key of the input (String keys and values), the latest value
 * ("latest", a key-value store), a count per tumbling window ("per-window") and a count
 * per session ("sessions"). Its own interactive queries answer "dump" on stdin with one
 * JSON line of every store's content; it prints "RUNNING" when it runs.
 *
 * <p>Arguments: bootstrap servers, application id, input topic, state directory, window
 * size ms, session gap ms, and optionally "bytes": the input's keys taken as the bytes they
 * are (a registry serializer's, say) rather than as strings; the dump then gives them in hex.
 */
public final class StoresApp {
  /** Windows and sessions are kept this long past stream time (the default: only their own
   * size), so the stores keep every window a test's records make. */
  static final Duration RETAINED = Duration.ofDays(1);

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[3]);
    // every update reaches the changelog at once, as a user who wants fresh state sets it
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
    long size = Long.parseLong(args[4]);
    long gap = Long.parseLong(args[5]);

    StreamsBuilder builder = new StreamsBuilder();
    boolean bytes = args.length > 6 && args[6].equals("bytes");
    if (bytes) {
      build(builder, args[2], Serdes.ByteArray(), size, gap);
      shown = key -> quote(java.util.HexFormat.of().formatHex((byte[]) key));
    } else {
      build(builder, args[2], Serdes.String(), size, gap);
      shown = key -> quote((String) key);
    }

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    streams.setStateListener(
        (now, before) -> {
          if (now == KafkaStreams.State.RUNNING) {
            System.out.println("RUNNING");
            System.out.flush();
          }
        });
    Runtime.getRuntime().addShutdownHook(new Thread(() -> streams.close(Duration.ofSeconds(10))));
    streams.start();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line; (line = in.readLine()) != null; ) {
      if (line.trim().equals("dump")) {
        System.out.println(dump(streams));
        System.out.flush();
      }
    }
    streams.close(Duration.ofSeconds(10));
  }

  /** A key as the dump gives it: a JSON string. */
  static java.util.function.Function<Object, String> shown;

  static <K> void build(
      StreamsBuilder builder, String topic, Serde<K> keys, long size, long gap) {
    KGroupedStream<K, String> grouped =
        builder.stream(topic, Consumed.with(keys, Serdes.String())).groupByKey();
    grouped.reduce(
        (old, latest) -> latest,
        Materialized.<K, String, KeyValueStore<Bytes, byte[]>>as("latest")
            .withKeySerde(keys)
            .withValueSerde(Serdes.String()));
    grouped
        .windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(size)))
        .count(
            Materialized.<K, Long, WindowStore<Bytes, byte[]>>as("per-window")
                .withRetention(RETAINED));
    grouped
        .windowedBy(SessionWindows.ofInactivityGapWithNoGrace(Duration.ofMillis(gap)))
        .count(
            Materialized.<K, Long, SessionStore<Bytes, byte[]>>as("sessions")
                .withRetention(RETAINED));
  }

  static String dump(KafkaStreams streams) {
    StringBuilder out = new StringBuilder("{\"latest\":{");
    try (KeyValueIterator<Object, String> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("latest", QueryableStoreTypes.<Object, String>keyValueStore()))
            .all()) {
      String sep = "";
      while (it.hasNext()) {
        KeyValue<Object, String> kv = it.next();
        out.append(sep).append(shown.apply(kv.key)).append(':').append(quote(kv.value));
        sep = ",";
      }
    }
    out.append("},\"windows\":[");
    try (KeyValueIterator<Windowed<Object>, Long> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("per-window", QueryableStoreTypes.<Object, Long>windowStore()))
            .all()) {
      append(out, it);
    }
    out.append("],\"sessions\":[");
    try (KeyValueIterator<Windowed<Object>, Long> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("sessions", QueryableStoreTypes.<Object, Long>sessionStore()))
            .fetch(null, null)) {
      append(out, it);
    }
    return out.append("]}").toString();
  }

  static void append(StringBuilder out, KeyValueIterator<Windowed<Object>, Long> it) {
    String sep = "";
    while (it.hasNext()) {
      KeyValue<Windowed<Object>, Long> kv = it.next();
      out.append(sep)
          .append('[')
          .append(shown.apply(kv.key.key()))
          .append(',')
          .append(kv.key.window().start())
          .append(',')
          .append(kv.key.window().end())
          .append(',')
          .append(kv.value)
          .append(']');
      sep = ",";
    }
  }

  static String quote(String s) {
    StringBuilder q = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') q.append('\\').append(c);
      else if (c < 0x20) q.append(String.format("\\u%04x", (int) c));
      else q.append(c);
    }
    return q.append('"').toString();
  }
}
