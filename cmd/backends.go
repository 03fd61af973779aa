package cmd

// The backends, each registering its URL schemes with package lock.
import (
	_ "github.com/withlock/withlock/internal/lock/etcd"
	_ "github.com/withlock/withlock/internal/lock/file"
	_ "github.com/withlock/withlock/internal/lock/k8s"
	_ "github.com/withlock/withlock/internal/lock/mongodb"
	_ "github.com/withlock/withlock/internal/lock/mysql"
	_ "github.com/withlock/withlock/internal/lock/postgres"
	_ "github.com/withlock/withlock/internal/lock/redis"
	_ "github.com/withlock/withlock/internal/lock/s3"
)
