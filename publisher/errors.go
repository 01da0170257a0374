package publisher

import "errors"

// errNoTopic is the cause of a kafka.PoisonError for a row with no topic and
// no default topic.
var errNoTopic = errors.New("the row has no topic and no --default-topic is set")
