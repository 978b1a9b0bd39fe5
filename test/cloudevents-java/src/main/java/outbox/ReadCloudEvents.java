package outbox;

import io.cloudevents.CloudEvent;
import io.cloudevents.kafka.CloudEventDeserializer;
import java.time.Duration;
import java.time.format.DateTimeFormatter;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.UUID;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RecordDeserializationException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Reads a topic from the start as a Java application would, with the CloudEvents SDK's
 * CloudEventDeserializer, and prints one JSON object a line per record: its position, its key
 * and every attribute and extension as the SDK exposes them, or the SDK's error for a record it
 * refuses (then it seeks past that record, as an application's error handler would, so one run
 * reports them all). A record without a value (a tombstone) prints "cloudevent": null.
 *
 * Usage: ReadCloudEvents BOOTSTRAP TOPIC COUNT TIMEOUT_MS — stops after COUNT lines or the timeout.
 */
public final class ReadCloudEvents {
    public static void main(String[] args) {
        String bootstrap = args[0], topic = args[1];
        int count = Integer.parseInt(args[2]);
        long deadline = System.nanoTime() + Long.parseLong(args[3]) * 1_000_000L;
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, "cloudevents-java-" + UUID.randomUUID());
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, CloudEventDeserializer.class.getName());
        int printed = 0;
        try (KafkaConsumer<String, CloudEvent> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic));
            while (printed < count && System.nanoTime() < deadline) {
                try {
                    for (ConsumerRecord<String, CloudEvent> r : consumer.poll(Duration.ofMillis(500))) {
                        System.out.println(describe(r));
                        printed++;
                    }
                } catch (RecordDeserializationException e) {
                    TopicPartition tp = e.topicPartition();
                    Map<String, Object> refused = new TreeMap<>();
                    refused.put("partition", tp.partition());
                    refused.put("offset", e.offset());
                    refused.put("error", String.valueOf(e.getCause()));
                    System.out.println(json(refused));
                    printed++;
                    consumer.seek(tp, e.offset() + 1);
                }
            }
        }
        System.out.flush();
        System.exit(printed == count ? 0 : 2);
    }

    private static String describe(ConsumerRecord<String, CloudEvent> r) {
        CloudEvent ce = r.value();
        Map<String, Object> out = new TreeMap<>();
        out.put("partition", r.partition());
        out.put("offset", r.offset());
        out.put("key", r.key());
        if (ce == null) {
            out.put("cloudevent", null); // a tombstone: the deserializer gives no event for no value
            return json(out);
        }
        out.put("specversion", ce.getSpecVersion().toString());
        out.put("id", ce.getId());
        out.put("source", ce.getSource().toString());
        out.put("type", ce.getType());
        out.put("time", ce.getTime() == null ? null : ce.getTime().format(DateTimeFormatter.ISO_OFFSET_DATE_TIME));
        out.put("datacontenttype", ce.getDataContentType());
        out.put("dataschema", ce.getDataSchema() == null ? null : ce.getDataSchema().toString());
        out.put("subject", ce.getSubject());
        Map<String, Object> extensions = new TreeMap<>();
        for (String name : ce.getExtensionNames()) {
            extensions.put(name, String.valueOf(ce.getExtension(name)));
        }
        out.put("extensions", extensions);
        out.put("data", ce.getData() == null ? null : Base64.getEncoder().encodeToString(ce.getData().toBytes()));
        return json(out);
    }

    @SuppressWarnings("unchecked")
    private static String json(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof Number) {
            return v.toString();
        }
        if (v instanceof Map) {
            StringBuilder b = new StringBuilder("{");
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                b.append(b.length() > 1 ? ", " : "").append(json(e.getKey())).append(": ").append(json(e.getValue()));
            }
            return b.append('}').toString();
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : v.toString().toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20 || c > 0x7e) {
                // ASCII only: Java 17 writes stdout in the locale's charset, which under a C locale
                // turns every other character into '?'.
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}
