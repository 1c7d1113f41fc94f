import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Properties;
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
 * size ms, session gap ms.
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
    KGroupedStream<String, String> grouped =
        builder.stream(args[2], Consumed.with(Serdes.String(), Serdes.String())).groupByKey();
    grouped.reduce(
        (old, latest) -> latest,
        Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("latest")
            .withKeySerde(Serdes.String())
            .withValueSerde(Serdes.String()));
    grouped
        .windowedBy(TimeWindows.ofSizeWithNoGrace(Duration.ofMillis(size)))
        .count(
            Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("per-window")
                .withRetention(RETAINED));
    grouped
        .windowedBy(SessionWindows.ofInactivityGapWithNoGrace(Duration.ofMillis(gap)))
        .count(
            Materialized.<String, Long, SessionStore<Bytes, byte[]>>as("sessions")
                .withRetention(RETAINED));

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

  static String dump(KafkaStreams streams) {
    StringBuilder out = new StringBuilder("{\"latest\":{");
    try (KeyValueIterator<String, String> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("latest", QueryableStoreTypes.<String, String>keyValueStore()))
            .all()) {
      String sep = "";
      while (it.hasNext()) {
        KeyValue<String, String> kv = it.next();
        out.append(sep).append(quote(kv.key)).append(':').append(quote(kv.value));
        sep = ",";
      }
    }
    out.append("},\"windows\":[");
    try (KeyValueIterator<Windowed<String>, Long> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("per-window", QueryableStoreTypes.<String, Long>windowStore()))
            .all()) {
      append(out, it);
    }
    out.append("],\"sessions\":[");
    try (KeyValueIterator<Windowed<String>, Long> it =
        streams
            .store(StoreQueryParameters.fromNameAndType("sessions", QueryableStoreTypes.<String, Long>sessionStore()))
            .fetch(null, null)) {
      append(out, it);
    }
    return out.append("]}").toString();
  }

  static void append(StringBuilder out, KeyValueIterator<Windowed<String>, Long> it) {
    String sep = "";
    while (it.hasNext()) {
      KeyValue<Windowed<String>, Long> kv = it.next();
      out.append(sep)
          .append('[')
          .append(quote(kv.key.key()))
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
