// Command outboxd publishes transactional-outbox rows from PostgreSQL to
// Kafka by change data capture. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
)

func main() {
	ctx := context.Background()
	if err := dispatch(ctx, os.Args[1:]); err != nil {
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "outboxd: %v\n", err)
		os.Exit(1)
	}
}
