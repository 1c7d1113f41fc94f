package tablecast.kafka;

import java.nio.ByteBuffer;
import java.util.Map;
import org.apache.kafka.clients.producer.ProducerInterceptor;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;

/**
 * Gives a record the timestamp its "tablecast.ts" header carries (8 bytes, big-endian epoch
 * milliseconds) and drops that header. Spark's Kafka sink has no timestamp column, and table
 * records must carry the timestamp of the input record that produced them (Kafka Streams'
 * timestamp propagation), so the pipeline writes it as a header and this interceptor, set on
 * the sink's producer (kafka.interceptor.classes), moves it into the record.
 */
public final class TimestampFromHeader implements ProducerInterceptor<Object, Object> {
    public static final String HEADER = "tablecast.ts";

    @Override
    public ProducerRecord<Object, Object> onSend(ProducerRecord<Object, Object> record) {
        Header ts = record.headers().lastHeader(HEADER);
        if (ts == null) {
            return record;
        }
        RecordHeaders rest = new RecordHeaders();
        for (Header h : record.headers()) {
            if (!HEADER.equals(h.key())) {
                rest.add(h);
            }
        }
        byte[] v = ts.value();
        // a missing or negative time leaves the producer's own (Kafka refuses negative ones)
        Long millis = null;
        if (v != null && v.length == 8) {
            long t = ByteBuffer.wrap(v).getLong();
            millis = t >= 0 ? t : null;
        }
        return new ProducerRecord<>(
                record.topic(), record.partition(), millis, record.key(), record.value(), rest);
    }

    @Override
    public void onAcknowledgement(RecordMetadata metadata, Exception exception) {}

    @Override
    public void close() {}

    @Override
    public void configure(Map<String, ?> configs) {}
}
