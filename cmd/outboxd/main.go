// Command outboxd publishes transactional-outbox rows from PostgreSQL to
// Kafka by change data capture. See README.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	gometrics "github.com/rcrowley/go-metrics"
)

func main() {
	// sarama records its own go-metrics on every request; outboxd exports
	// Prometheus metrics instead, so turn those off (a package global: set
	// once, here, like sarama.Logger).
	gometrics.UseNilMetrics = true
	ctx := context.Background()
	if err := dispatch(ctx, os.Args[1:]); err != nil {
		var uerr *UsageError
		switch {
		case errors.Is(err, errHelp):
			return
		case errors.Is(err, errUsage):
			os.Exit(2)
		case errors.As(err, &uerr):
			fmt.Fprintf(os.Stderr, "outboxd: %v\n", err)
			os.Exit(2)
		}
		// pgconn puts each host tried on an indented line of its own: one
		// line per error, for logs and for `| tail -1`.
		fmt.Fprintf(os.Stderr, "outboxd: %s\n", strings.ReplaceAll(strings.ReplaceAll(err.Error(), ":\n\t", ": "), "\n\t", "; "))
		os.Exit(1)
	}
}
