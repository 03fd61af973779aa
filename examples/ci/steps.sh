#!/bin/sh
# Three steps under one lock, in a script with no single command to wrap.
# --until-pid $$ frees the lock however the script ends: a step that fails
# ends the script (set -e), and the keeper lets go within a second.
# WITHLOCK_DB names the lock's database.
set -eu

H=$(withlock acquire nightly-etl --timeout 1h --max-hold 6h --until-pid $$)
./extract.sh
# Still ours? Exit 70 stops the script before the step that needs the lock.
withlock status --handle "$H" >/dev/null
./load.sh
withlock release --handle "$H"
