#!/bin/sh
# A deploy step that runs on every host (or pod) at once. withlock lets one
# run the migrations while the others wait for it; they then run them too and
# find nothing left to do, so every host starts on the migrated schema.
# WITHLOCK_DB names the lock's database, e.g. postgres://deploy@db.internal/app.
set -eu

# First: would the lock exclude every host? Exit 78 for a trap (a read
# replica, a transaction pooler), 69 when the database cannot be reached:
# stop the deploy before anything depends on the lock.
withlock check

# Exit status 75: still held elsewhere after 10 minutes; 69: the lock's
# database cannot be reached. Either way, stop the deploy here.
withlock --timeout 10m dbmigration -- migrate up

systemctl restart shop
