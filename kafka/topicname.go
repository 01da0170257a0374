package kafka

import "fmt"

// maxTopicName is the longest topic name Kafka accepts.
const maxTopicName = 249

// ValidateTopicName applies Kafka's rules for a topic name (at most 249
// characters of ASCII letters, digits, '.', '_' and '-', and neither "."
// nor ".."), so that a name Kafka would refuse is refused before anything
// was created, with the rule in the message.
func ValidateTopicName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty topic name")
	case name == "." || name == "..":
		return fmt.Errorf("topic name %q: Kafka does not allow %q", name, name)
	case len(name) > maxTopicName:
		return fmt.Errorf("topic name of %d characters: Kafka allows at most %d", len(name), maxTopicName)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q: Kafka allows only ASCII letters, digits, '.', '_' and '-', not %q", name, c)
		}
	}
	return nil
}
