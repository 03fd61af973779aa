package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// server runs serve in the test process on a free port and stops it when t ends.
type server struct {
	uri  string
	port int
	dir  string
	stop func() // cancels serve and waits for it to return
}

func startServer(t *testing.T, dir string, port int) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &server{dir: dir}
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, config{
			port:   port,
			dir:    dir,
			logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			grace:  500 * time.Millisecond,
			ready: func(uri string, port int) error {
				s.uri, s.port = uri, port
				close(ready)
				return nil
			},
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	}
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(s.stop)
	return s
}

func connect(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(context.Background()) })
	return c
}

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// errCode returns the server's error code in err (command error or the first
// write error), or 0.
func errCode(err error) int {
	var ce mongo.CommandError
	if errors.As(err, &ce) {
		return int(ce.Code)
	}
	var we mongo.WriteException
	if errors.As(err, &we) {
		if len(we.WriteErrors) > 0 {
			return we.WriteErrors[0].Code
		}
		if we.WriteConcernError != nil {
			return we.WriteConcernError.Code
		}
	}
	return 0
}

func TestServeStopRestart(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	s := startServer(t, dir, 0)
	t.Logf("ready after %v at %s", time.Since(start), s.uri)
	if want := "mongodb://127.0.0.1:" + strconv.Itoa(s.port) + "/"; s.uri != want {
		t.Errorf("uri = %q, want %q", s.uri, want)
	}
	c := connect(t, s.uri)
	coll := c.Database("withlock").Collection("kept")
	if _, err := coll.InsertOne(tctx(t), d("_id", "x", "v", "here")); err != nil {
		t.Fatal(err)
	}

	// A connected client must not hold up shutdown by FerretDB's 3s grace.
	start = time.Now()
	s.stop()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("stop with a connected client took %v", d)
	}

	// Another server on the port is refused with errAddrInUse while one listens.
	s2 := startServer(t, dir, s.port)
	err := serve(context.Background(), config{port: s.port, dir: t.TempDir(), logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, errAddrInUse) {
		t.Errorf("second server on port %d: %v, want errAddrInUse", s.port, err)
	}

	var got bson.M
	if err := connect(t, s2.uri).Database("withlock").Collection("kept").FindOne(tctx(t), d("_id", "x")).Decode(&got); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if got["v"] != "here" {
		t.Errorf("after restart: %v", got)
	}
}

// TestFacts checks what FerretDB v1 (SQLite handler) does where a lease-based
// lock on MongoDB depends on the server; see the report in testenv/mongo.go.
func TestFacts(t *testing.T) {
	s := startServer(t, t.TempDir(), 0)
	c := connect(t, s.uri)
	db := c.Database("withlock")

	t.Run("NoAuth", func(t *testing.T) {
		if err := db.RunCommand(tctx(t), d("ping", 1)).Err(); err != nil {
			t.Fatalf("ping without credentials: %v", err)
		}
		// Credentials are not checked: PLAIN passes with any user and password.
		// The driver's default mechanism (SCRAM-SHA-1 or -256) is refused with
		// AuthenticationFailed (18), so a URL with credentials needs
		// ?authMechanism=PLAIN.
		for _, tc := range []struct {
			query string
			code  int
		}{
			{"?authMechanism=PLAIN", 0},
			{"", 18},
			{"?authMechanism=SCRAM-SHA-256", 18},
		} {
			uri := "mongodb://nobody:wrong@127.0.0.1:" + strconv.Itoa(s.port) + "/" + tc.query
			err := connect(t, uri).Database("withlock").RunCommand(tctx(t), d("ping", 1)).Err()
			t.Logf("ping as nobody:wrong %s: %v", tc.query, err)
			var code int
			var se mongo.ServerError
			if errors.As(err, &se) {
				for _, c := range []int{18} {
					if se.HasErrorCode(c) {
						code = c
					}
				}
			}
			if (err == nil) != (tc.code == 0) || code != tc.code {
				t.Errorf("%s: err = %v, want code %d", uri, err, tc.code)
			}
		}
	})

	t.Run("ServerClock", func(t *testing.T) {
		// hello, isMaster and serverStatus report the server's time.Now as a BSON
		// date (milliseconds).
		for _, cmd := range []string{"hello", "isMaster", "serverStatus"} {
			before := time.Now().Truncate(time.Millisecond)
			raw, err := db.RunCommand(tctx(t), d(cmd, 1)).Raw()
			after := time.Now()
			if err != nil {
				t.Fatalf("%s: %v", cmd, err)
			}
			v, err := raw.LookupErr("localTime")
			if err != nil {
				t.Fatalf("%s: no localTime: %s", cmd, raw)
			}
			dt, ok := v.DateTimeOK()
			if !ok {
				t.Fatalf("%s: localTime is %s, not a date", cmd, v.Type)
			}
			lt := time.UnixMilli(dt)
			if lt.Before(before) || lt.After(after) {
				t.Errorf("%s: localTime %v not within [%v, %v]", cmd, lt, before, after)
			}
		}
	})

	t.Run("NoNOW", func(t *testing.T) {
		coll := db.Collection("now")
		if _, err := coll.InsertOne(tctx(t), d("_id", "a", "exp", time.Now().Add(-time.Hour))); err != nil {
			t.Fatal(err)
		}
		// $$NOW in an aggregation expression is not evaluated: $project passes
		// the string "$$NOW" through as a literal.
		cur, err := coll.Aggregate(tctx(t), mongo.Pipeline{d("$project", d("now", "$$NOW"))})
		var docs []bson.M
		if err == nil {
			err = cur.All(tctx(t), &docs) // the error, if any, comes with the first batch
		}
		t.Logf("aggregate $project {now: $$NOW}: %v %v", docs, err)
		if err != nil || len(docs) != 1 || docs[0]["now"] != "$$NOW" {
			t.Errorf("$project $$NOW: %v %v, want the literal string", docs, err)
		}
		// $expr with a comparison (and so with $$NOW) in a query.
		err = coll.FindOne(tctx(t), d("$expr", d("$lt", bson.A{"$exp", "$$NOW"}))).Err()
		t.Logf("find $expr $lt $$NOW: code %d: %v", errCode(err), err)
		if errCode(err) != 238 { // NotImplemented
			t.Errorf("$expr $lt: %v, want code 238", err)
		}
		// An update pipeline (where $$NOW would go in MongoDB).
		_, err = coll.UpdateOne(tctx(t), d("_id", "a"), mongo.Pipeline{d("$set", d("at", "$$NOW"))})
		t.Logf("update pipeline $set $$NOW: code %d: %v", errCode(err), err)
		if errCode(err) != 14 { // TypeMismatch
			t.Errorf("update pipeline: %v, want code 14", err)
		}
	})

	t.Run("CurrentDate", func(t *testing.T) {
		// $currentDate sets a field to the server's time, in an upsert too.
		coll := db.Collection("currentdate")
		before := time.Now().Truncate(time.Millisecond)
		_, err := coll.UpdateOne(tctx(t), d("_id", "a"), d("$currentDate", d("at", true)), options.UpdateOne().SetUpsert(true))
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		var doc struct{ At time.Time }
		if err := coll.FindOne(tctx(t), d("_id", "a")).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if doc.At.Before(before) || doc.At.After(after) {
			t.Errorf("$currentDate: %v not within [%v, %v]", doc.At, before, after)
		}
	})

	t.Run("NoTTLIndex", func(t *testing.T) {
		_, err := db.Collection("ttl").Indexes().CreateOne(tctx(t), mongo.IndexModel{
			Keys:    d("exp", 1),
			Options: options.Index().SetExpireAfterSeconds(0),
		})
		t.Logf("createIndexes expireAfterSeconds: code %d: %v", errCode(err), err)
		if errCode(err) != 238 { // NotImplemented
			t.Errorf("TTL index: err = %v, want code 238 (NotImplemented)", err)
		}
	})

	t.Run("DuplicateKey11000", func(t *testing.T) {
		coll := db.Collection("dup")
		ctx := tctx(t)
		if _, err := coll.InsertOne(ctx, d("_id", "n", "token", "t1")); err != nil {
			t.Fatal(err)
		}
		_, err := coll.InsertOne(ctx, d("_id", "n", "token", "t2"))
		if errCode(err) != 11000 || !mongo.IsDuplicateKeyError(err) {
			t.Errorf("insert duplicate _id: code %d, IsDuplicateKeyError %v: %v", errCode(err), mongo.IsDuplicateKeyError(err), err)
		}
		// Unique secondary indexes exist and report 11000 too.
		if _, err := coll.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: d("token", 1), Options: options.Index().SetUnique(true)}); err != nil {
			t.Fatal(err)
		}
		_, err = coll.InsertOne(ctx, d("_id", "m", "token", "t1"))
		if errCode(err) != 11000 || !mongo.IsDuplicateKeyError(err) {
			t.Errorf("insert duplicate unique field: code %d: %v", errCode(err), err)
		}
	})

	t.Run("WriteConcernMajority", func(t *testing.T) {
		coll := db.Collection("wc", options.Collection().SetWriteConcern(&writeconcern.WriteConcern{W: "majority", Journal: new(true)}))
		ctx := tctx(t)
		if _, err := coll.InsertOne(ctx, d("_id", "a")); err != nil {
			t.Errorf("insert w:majority j:true: %v", err)
		}
		if err := coll.FindOneAndUpdate(ctx, d("_id", "a"), d("$set", d("x", 1))).Err(); err != nil {
			t.Errorf("findAndModify w:majority: %v", err)
		}
		if _, err := coll.DeleteOne(ctx, d("_id", "a")); err != nil {
			t.Errorf("delete w:majority: %v", err)
		}
		raw, err := db.RunCommand(ctx, d(
			"insert", "wc", "documents", bson.A{d("_id", "b")},
			"writeConcern", d("w", "majority", "wtimeout", 1000),
		)).Raw()
		t.Logf("raw insert w:majority: %v %s", err, raw)
		if err != nil {
			t.Error(err)
		}
		if _, err := raw.LookupErr("writeConcernError"); err == nil {
			t.Errorf("writeConcernError in %s", raw)
		}
	})

	t.Run("LeaseUpsert", func(t *testing.T) {
		// The acquire a lease backend would send: match the lock only if it is
		// expired (or ours), else upsert, which collides with the existing _id.
		coll := db.Collection("locks")
		ctx := tctx(t)
		now := time.Now()
		acquire := func(token string, now time.Time) (bson.M, error) {
			var doc bson.M
			err := coll.FindOneAndUpdate(ctx,
				d("_id", "job", "$or", bson.A{d("exp", d("$lte", now)), d("token", token)}),
				d("$set", d("token", token, "exp", now.Add(15*time.Second)), "$currentDate", d("at", true)),
				options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After),
			).Decode(&doc)
			return doc, err
		}
		doc, err := acquire("A", now)
		if err != nil || doc["token"] != "A" {
			t.Fatalf("free lock: %v %v", doc, err)
		}
		_, err = acquire("B", now)
		t.Logf("held lock, upsert by another: code %d: %v", errCode(err), err)
		if errCode(err) != 11000 || !mongo.IsDuplicateKeyError(err) {
			t.Errorf("held lock: err = %v, want duplicate key 11000", err)
		}
		if doc, err := acquire("A", now); err != nil || doc["token"] != "A" {
			t.Errorf("renew by holder: %v %v", doc, err)
		}
		doc, err = acquire("B", now.Add(time.Minute))
		if err != nil || doc["token"] != "B" {
			t.Errorf("expired lock taken over: %v %v", doc, err)
		}
		// updateOne with upsert collides the same way.
		_, err = coll.UpdateOne(ctx, d("_id", "job", "exp", d("$lte", now)), d("$set", d("token", "C")), options.UpdateOne().SetUpsert(true))
		if errCode(err) != 11000 || !mongo.IsDuplicateKeyError(err) {
			t.Errorf("updateOne upsert on a held lock: err = %v, want duplicate key 11000", err)
		}
		// Raw findAndModify reply of an upsert and of an update.
		raw, err := db.RunCommand(ctx, d(
			"findAndModify", "locks", "query", d("_id", "other"),
			"update", d("$set", d("token", "C")), "upsert", true, "new", true,
		)).Raw()
		t.Logf("findAndModify upsert reply: %s %v", raw, err)
		if v, err := raw.LookupErr("lastErrorObject", "upserted"); err != nil || v.StringValue() != "other" {
			t.Errorf("upsert: lastErrorObject.upserted = %v, %v", v, err)
		}
		// Release by token.
		res, err := coll.DeleteOne(ctx, d("_id", "job", "token", "A"))
		if err != nil || res.DeletedCount != 0 {
			t.Errorf("release with a stale token: %+v %v", res, err)
		}
		res, err = coll.DeleteOne(ctx, d("_id", "job", "token", "B"))
		if err != nil || res.DeletedCount != 1 {
			t.Errorf("release by holder: %+v %v", res, err)
		}
	})

	t.Run("NoTransactions", func(t *testing.T) {
		sess, err := c.StartSession()
		if err != nil {
			t.Logf("StartSession: %v", err)
			return
		}
		defer sess.EndSession(context.Background())
		_, err = sess.WithTransaction(tctx(t), func(ctx context.Context) (any, error) {
			return db.Collection("tx").InsertOne(ctx, d("_id", 1))
		})
		t.Logf("transaction: code %d: %v", errCode(err), err)
		if err == nil {
			t.Error("transaction accepted")
		}
	})

	t.Run("UpsertInsertAtomic", func(t *testing.T) {
		// Concurrent upserts of a missing lock: the insert is one SQLite INSERT
		// on the primary key, so exactly one wins and the others get 11000.
		coll := db.Collection("insertrace")
		ctx := tctx(t)
		const workers = 8
		for round := range 50 {
			id := "r" + strconv.Itoa(round)
			start := make(chan struct{})
			results := make(chan error, workers)
			for w := range workers {
				go func() {
					<-start
					now := time.Now()
					results <- coll.FindOneAndUpdate(ctx,
						d("_id", id, "exp", d("$lte", now)),
						d("$set", d("token", "w"+strconv.Itoa(w), "exp", now.Add(time.Minute))),
						options.FindOneAndUpdate().SetUpsert(true),
					).Err()
				}()
			}
			close(start)
			wins := 0
			for range workers {
				err := <-results
				switch {
				case err == nil || errors.Is(err, mongo.ErrNoDocuments): // upserted; no "new": no document returned
					wins++
				case !mongo.IsDuplicateKeyError(err):
					t.Errorf("round %d: %v", round, err)
				}
			}
			if wins != 1 {
				t.Fatalf("round %d: %d winners", round, wins)
			}
		}
	})

	t.Run("ConditionalDeleteNotAtomic", func(t *testing.T) {
		// delete also reads, then deletes by _id alone: a release whose read saw
		// its own token deletes the document even if another holder replaced it
		// meanwhile. Race a stale release against a takeover until that shows.
		coll := db.Collection("delrace")
		ctx := tctx(t)
		rounds, lost := 0, 0
		for rounds < 500 && lost == 0 {
			rounds++
			id := "r" + strconv.Itoa(rounds)
			if _, err := coll.InsertOne(ctx, d("_id", id, "token", "A")); err != nil {
				t.Fatal(err)
			}
			start := make(chan struct{})
			done := make(chan int64, 2)
			go func() {
				<-start
				res, err := coll.DeleteOne(ctx, d("_id", id, "token", "A"))
				if err != nil {
					t.Error(err)
					done <- 0
					return
				}
				done <- res.DeletedCount
			}()
			go func() {
				<-start
				res, err := coll.UpdateOne(ctx, d("_id", id, "token", "A"), d("$set", d("token", "B")))
				if err != nil {
					t.Error(err)
					done <- 0
					return
				}
				done <- res.ModifiedCount
			}()
			close(start)
			if <-done+<-done == 2 {
				// Both the release of A and the takeover by B succeeded: B's lock
				// is gone.
				if err := coll.FindOne(ctx, d("_id", id)).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
					t.Fatalf("round %d: both succeeded but the document is there: %v", rounds, err)
				}
				lost++
			}
		}
		t.Logf("first lost takeover after %d rounds", rounds)
		if lost == 0 {
			t.Errorf("no takeover lost to a concurrent stale delete in %d rounds", rounds)
		}
	})

	t.Run("ConditionalUpdateNotAtomic", func(t *testing.T) {
		// findAndModify and update read the matching documents, then write each
		// back by _id in a separate SQLite statement, without checking the filter
		// again. So concurrent takeovers of one expired lock can all succeed.
		coll := db.Collection("race")
		ctx := tctx(t)
		const workers = 8
		rounds, doubles := 0, 0
		for rounds < 300 && doubles < 3 {
			rounds++
			id := "r" + strconv.Itoa(rounds)
			past := time.Now().Add(-time.Minute)
			if _, err := coll.InsertOne(ctx, d("_id", id, "token", "old", "exp", past)); err != nil {
				t.Fatal(err)
			}
			start := make(chan struct{})
			wins := make(chan string, workers)
			errs := make(chan error, workers)
			for w := range workers {
				go func() {
					<-start
					token := "w" + strconv.Itoa(w)
					now := time.Now()
					err := coll.FindOneAndUpdate(ctx,
						d("_id", id, "exp", d("$lte", now)),
						d("$set", d("token", token, "exp", now.Add(time.Minute))),
					).Err()
					switch {
					case err == nil:
						wins <- token
					case errors.Is(err, mongo.ErrNoDocuments):
						wins <- ""
					default:
						errs <- err
						wins <- ""
					}
				}()
			}
			close(start)
			n := 0
			for range workers {
				if <-wins != "" {
					n++
				}
			}
			close(errs)
			for err := range errs {
				t.Errorf("round %d: %v", rounds, err)
			}
			if n > 1 {
				doubles++
			}
		}
		t.Logf("%d of %d rounds had more than one winner of the same expired lock", doubles, rounds)
		if doubles == 0 {
			t.Errorf("no round had two winners in %d rounds: the conditional update looks atomic after all", rounds)
		}
	})
}

// d builds a bson.D from keys and values.
func d(kv ...any) bson.D {
	doc := make(bson.D, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		doc = append(doc, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return doc
}
