package dev.tablecast.peers;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

/**
 * The Kafka Streams side of {@code python -m bench pipeline}'s group_by/reduce comparison.
 *
 * <p>{@code GroupByReduce BOOTSTRAP TOPIC STATE_DIR THREADS [WARM_TOPIC]}: the same job as tablecast's
 * benchmark pipeline — a KTable of JSON values {"g": group, "n": number} re-grouped by g with n
 * summed (an adder and a subtractor, so an updated row moves its old number out), into a RocksDB
 * store, results to TOPIC-sums (created beforehand) — with exactly-once processing (tablecast's pipeline is exact after
 * a kill -9 too). The input is produced before it starts. It runs until its consumer group has
 * committed the end of the input and of the repartition topic, and prints one JSON line: seconds
 * from the first record through the selector to that point, and from start. With WARM_TOPIC
 * (input produced there too) the job first drains that topic in the same JVM, unmeasured.
 */
public final class GroupByReduce {
  private static final ObjectMapper JSON = new ObjectMapper();

  public static void main(String[] args) throws Exception {
    if (args.length != 4 && args.length != 5) {
      System.err.println("usage: GroupByReduce BOOTSTRAP TOPIC STATE_DIR THREADS [WARM_TOPIC]");
      System.exit(2);
    }
    String bootstrap = args[0], topic = args[1], stateDir = args[2];
    int threads = Integer.parseInt(args[3]);
    String warmup = "";
    if (args.length == 5) {
      // the same job on another topic first, in this JVM: its JIT is then as warm as a
      // Spark session that has run a group_by before
      double[] warm = run(bootstrap, args[4], stateDir + "/warm", threads);
      warmup = String.format(", \"warmup_seconds\": %.3f", warm[0]);
    }
    double[] measured = run(bootstrap, topic, stateDir + "/run", threads);
    System.out.printf(
        "{\"seconds\": %.3f, \"wall_seconds_with_start\": %.3f%s}%n",
        measured[0], measured[1], warmup);
    System.out.flush();
  }

  /** Runs the job on `topic` until drained: {seconds from the first record, from start}. */
  private static double[] run(String bootstrap, String topic, String stateDir, int threads)
      throws Exception {
    String app = "ks-groupby-" + topic;
    AtomicLong firstRecordNanos = new AtomicLong();

    StreamsBuilder builder = new StreamsBuilder();
    builder.table(topic, Consumed.with(Serdes.String(), Serdes.String()))
        .groupBy(
            (k, v) -> {
              firstRecordNanos.compareAndSet(0, System.nanoTime());
              JsonNode row = parse(v);
              return KeyValue.pair(row.get("g").asText(), row.get("n").asLong());
            },
            Grouped.with(Serdes.String(), Serdes.Long()))
        .reduce(Long::sum, (a, b) -> a - b, Materialized.as("sums"))
        .toStream()
        .to(topic + "-sums", Produced.with(Serdes.String(), Serdes.Long()));

    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
    p.put(StreamsConfig.TOPOLOGY_OPTIMIZATION_CONFIG, StreamsConfig.OPTIMIZE);
    p.put("consumer.auto.offset.reset", "earliest");

    long started = System.nanoTime();
    try (KafkaStreams streams = new KafkaStreams(builder.build(p), p);
        Admin admin = Admin.create(Map.of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
      streams.setStateListener(
          (now, before) -> {
            if (now == KafkaStreams.State.ERROR) { // a dead stream thread: say so, do not wait
              System.err.println("GroupByReduce: Kafka Streams went to ERROR");
              System.exit(1);
            }
          });
      streams.start();
      String repartition = app + "-";
      while (true) {
        Thread.sleep(100);
        if (firstRecordNanos.get() != 0 && drained(admin, app, topic, repartition)) {
          break;
        }
      }
      long done = System.nanoTime();
      return new double[] {(done - firstRecordNanos.get()) / 1e9, (done - started) / 1e9};
    }
  }

  private static JsonNode parse(String value) {
    try {
      return JSON.readTree(value);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Whether the group committed the end of the input topic and of its repartition topic(s). */
  private static boolean drained(Admin admin, String group, String topic, String internalPrefix)
      throws Exception {
    Map<TopicPartition, OffsetAndMetadata> committed =
        admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
    Set<TopicPartition> inputs =
        admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().stream()
            .map(i -> new TopicPartition(topic, i.partition()))
            .collect(Collectors.toSet());
    boolean sawRepartition = false;
    Map<TopicPartition, OffsetSpec> ask = new HashMap<>();
    for (TopicPartition tp : inputs) {
      ask.put(tp, OffsetSpec.latest());
    }
    for (TopicPartition tp : committed.keySet()) {
      if (tp.topic().startsWith(internalPrefix) && tp.topic().endsWith("-repartition")) {
        ask.put(tp, OffsetSpec.latest());
        sawRepartition = true;
      }
    }
    if (!sawRepartition || !committed.keySet().containsAll(inputs)) {
      return false;
    }
    var ends = admin.listOffsets(ask).all().get();
    for (var e : ends.entrySet()) {
      OffsetAndMetadata at = committed.get(e.getKey());
      // the repartition topic is written in transactions: its last offset is a commit
      // marker, which the group's committed position may stop just before
      long end = e.getValue().offset() - (inputs.contains(e.getKey()) ? 0 : 1);
      if (at == null || at.offset() < end) {
        return false;
      }
    }
    return true;
  }
}
