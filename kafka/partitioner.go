package kafka

import (
	"math/rand/v2"

	"github.com/IBM/sarama"
)

// murmur2 is Kafka's Utils.murmur2 (the Java client's key hash), returned
// as the same 32 bits.
func murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	i := 0
	for ; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch n - i {
	case 3:
		h ^= uint32(data[i+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[i+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[i])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// javaPartitioner places keyed records where the Java client's default
// partitioner does: toPositive(murmur2(key)) % numPartitions. sarama's own
// hash partitioner uses FNV-1a and would split a key's history across
// partitions when Java producers write the same topic.
type javaPartitioner struct{}

// NewJavaPartitioner is a sarama.PartitionerConstructor.
func NewJavaPartitioner(string) sarama.Partitioner { return javaPartitioner{} }

func (javaPartitioner) Partition(msg *sarama.ProducerMessage, numPartitions int32) (int32, error) {
	if msg.Key == nil {
		return rand.Int32N(numPartitions), nil
	}
	key, err := msg.Key.Encode()
	if err != nil {
		return -1, err
	}
	return int32(murmur2(key)&0x7fffffff) % numPartitions, nil
}

func (javaPartitioner) RequiresConsistency() bool { return true }
