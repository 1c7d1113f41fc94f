package dev.tablecast.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.stream.Collectors;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.Serializer;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyQueryMetadata;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.StreamsMetadata;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.query.KeyQuery;
import org.apache.kafka.streams.query.StateQueryRequest;
import org.apache.kafka.streams.query.StateQueryResult;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.HostInfo;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams interactive-queries reference that tablecast is measured against.
 *
 * <p>A KTable materialized from the input topic (String key, JSON text value) into a persistent
 * RocksDB store, and a small HTTP server: {@code GET /keys/{k}} reads the local store when this
 * instance owns the key's partition, or forwards to the owner that {@link
 * KafkaStreams#queryMetadataForKey} names, as the classic Confluent interactive-queries examples
 * do. {@code GET /ready} answers 200 once the instance is RUNNING; {@code GET /hosts} lists every
 * instance of the application with the partitions it owns; {@code GET /positions} the input offset
 * each local store has applied; {@code GET /restores} how far each partition's restore got and where
 * it started (what the store held already), also while the stores cannot be queried.
 */
public final class InteractiveQueries {
  static final String STORE = "kv";
  /** Marks a forwarded request: an instance that lost the key meanwhile answers 503, no loop. */
  static final String FORWARDED = "X-IQ-Forwarded";
  /** Names the instance whose store answered, so callers can see a forward happened. */
  static final String SERVED_BY = "X-IQ-Served-By";

  private static final Serializer<String> KEYS = Serdes.String().serializer();

  private final Config config;
  private final KafkaStreams streams;
  private final HostInfo self;
  private final HttpClient forwarder;
  private final Map<Integer, ReadOnlyKeyValueStore<String, String>> stores =
      new ConcurrentHashMap<>();
  /** Input partition -> last offset restored into its store (restores do not move positions). */
  private final Map<Integer, Long> restored = new ConcurrentHashMap<>();
  /** Input partition -> offset its last restore started from (its checkpoint: records kept). */
  private final Map<Integer, Long> restoreStarts = new ConcurrentHashMap<>();
  private final Logger log = LoggerFactory.getLogger(InteractiveQueries.class);

  InteractiveQueries(Config config) {
    this.config = config;
    this.self = HostInfo.buildFromEndpoint(config.applicationServer);
    this.streams = new KafkaStreams(topology(config), streamsProperties(config));
    // one pooled keep-alive client for all forwards
    this.forwarder =
        HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofSeconds(2))
            .build();
  }

  static org.apache.kafka.streams.Topology topology(Config c) {
    StreamsBuilder builder = new StreamsBuilder();
    var store =
        Materialized.<String, String>as(Stores.persistentKeyValueStore(STORE))
            .withKeySerde(Serdes.String())
            .withValueSerde(Serdes.String());
    if (!c.groupSums) {
      builder.table(c.topic, Consumed.with(Serdes.String(), Serdes.String()), store);
      return builder.build(streamsProperties(c));
    }
    // the table's rows {"g": group, "n": number} re-grouped by g with n summed (an adder and
    // a subtractor): the store holds each group's sum, as text
    builder.table(c.topic, Consumed.with(Serdes.String(), Serdes.String()))
        .groupBy(
            (k, v) -> {
              JsonNode row = parse(v);
              return KeyValue.pair(row.get("g").asText(), row.get("n").asText());
            },
            Grouped.with(Serdes.String(), Serdes.String()))
        .reduce(
            (a, b) -> String.valueOf(Long.parseLong(a) + Long.parseLong(b)),
            (a, b) -> String.valueOf(Long.parseLong(a) - Long.parseLong(b)),
            store);
    return builder.build(streamsProperties(c));
  }

  private static final ObjectMapper JSON = new ObjectMapper();

  private static JsonNode parse(String v) {
    try {
      return JSON.readTree(v);
    } catch (IOException e) {
      throw new java.io.UncheckedIOException(e);
    }
  }

  static Properties streamsProperties(Config c) {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, c.applicationId);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, c.bootstrapServers);
    p.put(StreamsConfig.STATE_DIR_CONFIG, c.stateDir);
    p.put(StreamsConfig.APPLICATION_SERVER_CONFIG, c.applicationServer);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, c.streamThreads);
    p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, c.standbyReplicas);
    // a source KTable then uses its input topic as changelog, as tablecast's
    // nodes read the table topic: no second copy of the data is written
    p.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
    p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
    p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
    p.putAll(c.extra);
    return p;
  }

  void run() throws Exception {
    streams.setStateListener((now, before) -> log.info("state {} -> {}", before, now));
    streams.setGlobalStateRestoreListener(new RestoreProgress());
    HttpFront front = HttpFront.of(config.http);
    CountDownLatch stopped = new CountDownLatch(1);
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  log.info("stopping");
                  front.stop();
                  // leave the group: otherwise a restarted instance waits out the old
                  // member's session timeout (45 s) before its partitions move back
                  streams.close(
                      CloseOptions.groupMembershipOperation(
                              CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                          .withTimeout(Duration.ofSeconds(10)));
                  stopped.countDown();
                }));
    streams.start();
    front.start(config, this::route);
    log.info(
        "serving {} from topic {} on http://{}:{} ({}) as {}",
        STORE,
        config.topic,
        config.bind,
        config.port,
        config.http,
        config.applicationServer);
    stopped.await();
  }

  /** An answer: status, JSON body and the instance that read the store (or null). */
  record Reply(int status, byte[] body, String servedBy) {
    static Reply json(int status, String body) {
      return new Reply(status, body.getBytes(StandardCharsets.UTF_8), null);
    }
  }

  /**
   * The answer to a request, whichever HTTP server carries it: the store reads are synchronous
   * (a RocksDB get), a forward completes when the owner answers.
   */
  CompletableFuture<Reply> route(String method, String rawPath, boolean forwarded) {
    try {
      if (!"GET".equals(method)) {
        return done(Reply.json(405, error("method_not_allowed", method)));
      }
      if (rawPath.startsWith("/keys/")) {
        return key(rawPath, forwarded).exceptionally(InteractiveQueries::failed);
      }
      return done(
          switch (rawPath) {
            case "/ready" -> ready();
            case "/hosts" -> hosts();
            case "/positions" -> positions();
            case "/restores" -> restores();
            default -> Reply.json(404, error("not_found", rawPath));
          });
    } catch (Exception e) {
      return done(failed(e));
    }
  }

  private static CompletableFuture<Reply> done(Reply reply) {
    return CompletableFuture.completedFuture(reply);
  }

  private static Reply failed(Throwable e) {
    Throwable cause = e instanceof java.util.concurrent.CompletionException && e.getCause() != null
        ? e.getCause() : e;
    if (cause instanceof InvalidStateStoreException) {
      // the store is closed, migrating or not local any more: a rebalance
      return Reply.json(503, error("unavailable", String.valueOf(cause.getMessage())));
    }
    if (cause instanceof IOException) {
      return Reply.json(502, error("forward_failed", String.valueOf(cause)));
    }
    LoggerFactory.getLogger(InteractiveQueries.class).warn("request failed", cause);
    return Reply.json(500, error("internal", String.valueOf(cause)));
  }

  private CompletableFuture<Reply> key(String rawPath, boolean forwarded) {
    String key =
        java.net.URLDecoder.decode(
            rawPath.substring("/keys/".length()).replace("+", "%2B"), StandardCharsets.UTF_8);
    if (key.isEmpty()) {
      return done(Reply.json(400, error("bad_request", "no key")));
    }
    KeyQueryMetadata meta = streams.queryMetadataForKey(STORE, key, KEYS);
    if (meta == null || KeyQueryMetadata.NOT_AVAILABLE.equals(meta)) {
      return done(Reply.json(503, error("unavailable", "no owner known for the key yet")));
    }
    if (!self.equals(meta.activeHost()) && !forwarded) {
      return forward(meta.activeHost(), rawPath);
    }
    String value = store(meta.partition()).get(key);
    String servedBy = config.applicationServer;
    if (value == null) {
      return done(
          new Reply(404, error("key_not_found", key).getBytes(StandardCharsets.UTF_8), servedBy));
    }
    // the value is JSON text already: embed it as is
    String body = "{\"key\":" + quote(key) + ",\"value\":" + value + "}";
    return done(new Reply(200, body.getBytes(StandardCharsets.UTF_8), servedBy));
  }

  /** The store of one partition; reading only it skips probing every local partition. */
  private ReadOnlyKeyValueStore<String, String> store(int partition) {
    // the handle looks its store up on every get, so it stays valid across rebalances
    return stores.computeIfAbsent(
        partition,
        p ->
            streams.store(
                StoreQueryParameters.fromNameAndType(
                        STORE, QueryableStoreTypes.<String, String>keyValueStore())
                    .withPartition(p)));
  }

  /** The owner's answer, without holding a thread while it comes (an event loop must not). */
  private CompletableFuture<Reply> forward(HostInfo owner, String rawPath) {
    HttpRequest request =
        HttpRequest.newBuilder(URI.create("http://" + owner.host() + ":" + owner.port() + rawPath))
            .header(FORWARDED, config.applicationServer)
            .timeout(Duration.ofSeconds(5))
            .GET()
            .build();
    return forwarder
        .sendAsync(request, HttpResponse.BodyHandlers.ofByteArray())
        .thenApply(
            response ->
                new Reply(
                    response.statusCode(),
                    response.body(),
                    response.headers().firstValue(SERVED_BY).orElse(null)));
  }

  private Reply ready() {
    KafkaStreams.State state = streams.state();
    String body = "{\"state\":" + quote(state.name()) + "}";
    return Reply.json(state == KafkaStreams.State.RUNNING ? 200 : 503, body);
  }

  /** Every instance of the application and the input partitions it owns (active and standby). */
  private Reply hosts() {
    Collection<StreamsMetadata> all = streams.streamsMetadataForStore(STORE);
    List<String> items = new ArrayList<>();
    for (StreamsMetadata m : all) {
      items.add(
          "{\"host\":"
              + quote(m.host() + ":" + m.port())
              + ",\"active\":"
              + partitions(m.topicPartitions())
              + ",\"standby\":"
              + partitions(m.standbyTopicPartitions())
              + "}");
    }
    return Reply.json(
        200,
        "{\"self\":"
            + quote(config.applicationServer)
            + ",\"state\":"
            + quote(streams.state().name())
            + ",\"hosts\":["
            + String.join(",", items)
            + "]}");
  }

  /**
   * The input-topic offset each local active store has applied, per partition, from the stores'
   * IQv2 positions: lets a harness wait until the table holds everything produced.
   */
  private Reply positions() {
    // any key will do: the answer's position is the store's, not the key's
    KeyQuery<String, String> probe = KeyQuery.withKey("");
    StateQueryResult<String> result =
        streams.query(StateQueryRequest.inStore(STORE).withQuery(probe).requireActive());
    Map<Integer, Long> applied = new TreeMap<>();
    result
        .getPartitionResults()
        .forEach(
            (partition, r) -> {
              if (r.isSuccess()) {
                Map<Integer, Long> offsets = r.getPosition().getPartitionPositions(config.topic);
                long processed = offsets.getOrDefault(partition, -1L);
                applied.put(partition, Math.max(processed, restored.getOrDefault(partition, -1L)));
              }
            });
    String items =
        applied.entrySet().stream()
            .map(e -> "\"" + e.getKey() + "\":" + e.getValue())
            .collect(Collectors.joining(",", "{", "}"));
    return Reply.json(200, "{\"positions\":" + items + "}");
  }

  /** {@code {"restored": {p: last offset restored}, "started": {p: offset the restore began at}}}. */
  private Reply restores() {
    return Reply.json(
        200, "{\"restored\":" + offsets(restored) + ",\"started\":" + offsets(restoreStarts) + "}");
  }

  private static String offsets(Map<Integer, Long> byPartition) {
    return new TreeMap<>(byPartition)
        .entrySet().stream()
            .map(e -> "\"" + e.getKey() + "\":" + e.getValue())
            .collect(Collectors.joining(",", "{", "}"));
  }

  /**
   * Records how far each partition's store was restored and logs restore progress. The store's
   * position only counts records processed; after a restore (a restart, or a partition moved here)
   * it starts empty, so the restored offset is what tells how much the store holds.
   */
  private final class RestoreProgress implements StateRestoreListener {
    private void note(TopicPartition tp, long lastOffset) {
      if (tp.topic().equals(config.topic)) {
        restored.merge(tp.partition(), lastOffset, Math::max);
      }
    }

    @Override
    public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
      // everything before `start` (the checkpointed offset) is in the store already
      note(tp, start - 1);
      if (tp.topic().equals(config.topic)) {
        restoreStarts.put(tp.partition(), start);
      }
      log.info("restoring {} of {} from offset {} to {}", tp, store, start, end);
    }

    @Override
    public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long count) {
      note(tp, batchEnd);
    }

    @Override
    public void onRestoreEnd(TopicPartition tp, String store, long total) {
      log.info("restored {} of {}: {} records", tp, store, total);
    }
  }

  private String partitions(Collection<TopicPartition> tps) {
    return tps.stream()
        .filter(tp -> tp.topic().equals(config.topic))
        .map(TopicPartition::partition)
        .sorted()
        .map(String::valueOf)
        .collect(Collectors.joining(",", "[", "]"));
  }

  static String error(String code, String message) {
    return "{\"error\":{\"code\":" + quote(code) + ",\"message\":" + quote(message) + "}}";
  }

  /** A JSON string literal. */
  static String quote(String s) {
    StringBuilder b = new StringBuilder(s.length() + 2).append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"' -> b.append("\\\"");
        case '\\' -> b.append("\\\\");
        case '\n' -> b.append("\\n");
        case '\r' -> b.append("\\r");
        case '\t' -> b.append("\\t");
        default -> {
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
        }
      }
    }
    return b.append('"').toString();
  }

  /**
   * Settings from {@code --name value} (or {@code --name=value}) arguments, else the environment
   * variable {@code IQ_NAME} (upper case, dashes as underscores), else a default. {@code --prop
   * k=v} (repeatable) passes any further Kafka Streams setting.
   */
  record Config(
      String bootstrapServers,
      String topic,
      String applicationId,
      String bind,
      int port,
      String stateDir,
      String applicationServer,
      int streamThreads,
      int httpThreads,
      int standbyReplicas,
      String http,
      boolean groupSums,
      Map<String, String> extra) {

    static Config parse(String[] args, Map<String, String> env) {
      Map<String, String> given = new LinkedHashMap<>();
      Map<String, String> extra = new LinkedHashMap<>();
      for (int i = 0; i < args.length; i++) {
        String a = args[i];
        if (!a.startsWith("--")) {
          throw new IllegalArgumentException("unexpected argument " + a);
        }
        String name;
        String value;
        int eq = a.indexOf('=');
        if (eq > 0) {
          name = a.substring(2, eq);
          value = a.substring(eq + 1);
        } else {
          if (i + 1 >= args.length) {
            throw new IllegalArgumentException(a + " needs a value");
          }
          name = a.substring(2);
          value = args[++i];
        }
        if (name.equals("prop")) {
          int split = value.indexOf('=');
          if (split <= 0) {
            throw new IllegalArgumentException("--prop wants key=value, got " + value);
          }
          extra.put(value.substring(0, split), value.substring(split + 1));
        } else {
          given.put(name, value);
        }
      }
      java.util.function.BiFunction<String, String, String> get =
          (name, fallback) -> {
            String v = given.get(name);
            if (v == null) {
              v = env.get("IQ_" + name.toUpperCase().replace('-', '_'));
            }
            if (v == null && fallback == null) {
              throw new IllegalArgumentException("--" + name + " is required");
            }
            return v == null ? fallback : v;
          };
      String bind = get.apply("bind", "127.0.0.1");
      int port = Integer.parseInt(get.apply("port", "7070"));
      int cores = Runtime.getRuntime().availableProcessors();
      return new Config(
          get.apply("bootstrap-servers", "127.0.0.1:9092"),
          get.apply("topic", null),
          get.apply("application-id", "kafka-streams-iq"),
          bind,
          port,
          get.apply("state-dir", "state"),
          get.apply("application-server", bind + ":" + port),
          Integer.parseInt(get.apply("stream-threads", "1")),
          // request threads block on store reads and on forwards. With few of them,
          // instances whose threads all wait on forwards to each other stall until
          // the forward timeout (3 instances, 17 connections each, 8 threads: ~4
          // req/s). 200 is Jetty's default maximum, which the Confluent
          // interactive-queries examples run on; idle threads cost nothing.
          Integer.parseInt(get.apply("http-threads", String.valueOf(Math.max(200, 4 * cores)))),
          Integer.parseInt(get.apply("standby-replicas", "0")),
          // the HTTP server: the JDK's, Jetty (seed 001's stack) or Reactor Netty (seed
          // 000's Spring reactive web runs on it)
          get.apply("http", "jdk"),
          // the store holds a group_by/reduce of the topic's rows, not the rows themselves
          Boolean.parseBoolean(get.apply("group-sums", "false")),
          extra);
    }
  }

  public static void main(String[] args) throws Exception {
    // before any class of com.sun.net.httpserver loads: without TCP_NODELAY a
    // keep-alive client waits on Nagle's algorithm and every GET takes ~40 ms
    System.setProperty(
        "sun.net.httpserver.nodelay", System.getProperty("sun.net.httpserver.nodelay", "true"));
    // Kafka's INFO logs are chatty; ours (state changes) stay on
    if (System.getProperty("org.slf4j.simpleLogger.log.org.apache.kafka") == null) {
      System.setProperty("org.slf4j.simpleLogger.log.org.apache.kafka", "warn");
    }
    System.setProperty("org.slf4j.simpleLogger.showDateTime", "true");
    Config config;
    try {
      config = Config.parse(args, System.getenv());
    } catch (IllegalArgumentException e) {
      System.err.println("kafka-streams-iq: " + e.getMessage());
      System.err.println(
          "usage: java -jar kafka-streams-iq.jar --topic T [--bootstrap-servers B]"
              + " [--application-id A] [--port P] [--bind H] [--state-dir D]"
              + " [--application-server H:P] [--stream-threads N] [--http-threads N]"
              + " [--standby-replicas N] [--http jdk|jetty|netty] [--group-sums true]"
              + " [--prop k=v ...]   (or env IQ_TOPIC, IQ_PORT, ...)");
      System.exit(2);
      return;
    }
    new InteractiveQueries(config).run();
  }
}
