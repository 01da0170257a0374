package e2e

// StatusReport is what "outboxd status --json" prints, as the tests read
// it: by its JSON names, as an operator's script would. It mirrors package
// main's statusReport field for field (cmd/outboxd's
// TestStatusReportMirrorIsComplete holds them together), so a field that
// changed type still fails the decoding.
type StatusReport struct {
	OK       bool     `json:"ok"`
	Problems []string `json:"problems"`
	// Warnings do not fail the status (exit 0).
	Warnings    []string          `json:"warnings"`
	Slot        StatusSlot        `json:"slot"`
	Publication StatusPublication `json:"publication"`
	Checkpoint  *StatusCheckpoint `json:"checkpoint,omitempty"`
}

// StatusCheckpoint is outboxd's checkpoint of the slot, read from Kafka.
type StatusCheckpoint struct {
	Topic    string `json:"topic"`
	Found    bool   `json:"found"`
	EndLSN   string `json:"end_lsn,omitempty"`
	SystemID string `json:"system_id,omitempty"`
	// Epoch is the epoch of the session that wrote it (0: written before
	// epochs): the highest is read, whatever arrived last.
	Epoch     int64  `json:"epoch,omitempty"`
	WrittenAt string `json:"written_at,omitempty"`
	// ReadTime is how long reading the topic to its high watermark took:
	// long when other producers' open transactions held it.
	ReadTime string `json:"read_time"`
}

// StatusSlot is StatusReport's slot.
type StatusSlot struct {
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Plugin            string `json:"plugin,omitempty"`
	Database          string `json:"database,omitempty"`
	Active            bool   `json:"active"`
	ActivePID         int32  `json:"active_pid,omitempty"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN        string `json:"restart_lsn,omitempty"`
	CurrentWALLSN     string `json:"current_wal_lsn,omitempty"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	WALStatus         string `json:"wal_status,omitempty"`
	SafeWALSize       *int64 `json:"safe_wal_size"`
	// Failover and Synced: pg_replication_slots (PostgreSQL 17+; absent before).
	Failover           *bool  `json:"failover,omitempty"`
	Synced             *bool  `json:"synced,omitempty"`
	InvalidationReason string `json:"invalidation_reason,omitempty"`
}

// StatusPublication is StatusReport's publication.
type StatusPublication struct {
	Name   string   `json:"name"`
	Exists bool     `json:"exists"`
	Tables []string `json:"tables"`
}
