package kafka

import (
	"testing"

	"github.com/IBM/sarama"
)

// Vectors from Kafka's UtilsTest.testMurmur2: the Java implementation's results.
func TestMurmur2MatchesKafka(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := int32(murmur2([]byte(c.in))); got != c.want {
			t.Errorf("murmur2(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestJavaPartitionerUsesPositiveMurmur2Modulo(t *testing.T) {
	p := NewJavaPartitioner("t")
	for _, key := range []string{"21", "foobar", "order-1", "order-42", "abc"} {
		want := int32(murmur2([]byte(key))&0x7fffffff) % 12
		got, err := p.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, 12)
		if err != nil || got != want {
			t.Errorf("Partition(%q) = %d, %v; want %d", key, got, err, want)
		}
	}
	// "21" hashes negative: a plain int32 modulo would give a negative partition.
	if got, _ := p.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder("21")}, 7); got < 0 || got >= 7 {
		t.Errorf("partition out of range: %d", got)
	}
}
