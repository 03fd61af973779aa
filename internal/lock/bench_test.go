package lock_test

import (
	"testing"

	"github.com/withlock/withlock/internal/lock"
	_ "github.com/withlock/withlock/internal/lock/postgres"
)

// BenchmarkOpen is URL parsing and backend set-up, without the network.
func BenchmarkOpen(b *testing.B) {
	for b.Loop() {
		bk, err := lock.Open("postgres://app:secret@db.internal:5432/app?sslmode=disable", lock.Options{})
		if err != nil {
			b.Fatal(err)
		}
		bk.Close()
	}
}

func BenchmarkCheckName(b *testing.B) {
	for b.Loop() {
		lock.CheckName("dbmigration")
	}
}

// BenchmarkReadClock is what the keep loop adds to every slice of its wait,
// besides resetting its timer: one reading of the monotonic and boot clocks.
func BenchmarkReadClock(b *testing.B) {
	for b.Loop() {
		lock.ReadClock()
	}
}
