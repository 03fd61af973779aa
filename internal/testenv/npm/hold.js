#!/usr/bin/env node
// hold.js takes a lock through the npm package advisory-lock, so that tests can
// check that withlock and advisory-lock exclude each other on the same name.
//
//   node hold.js [--no-stdin] URL NAME READYFILE
//       Tries the lock once (the library's tryLock: pg_try_advisory_lock(k1, k2)),
//       then writes "acquired\n" or "held\n" to READYFILE (atomically: a temporary
//       file renamed into place, so pollers never see a partial line). If acquired,
//       it keeps holding until stdin closes or it receives SIGTERM or SIGINT, then
//       unlocks and exits 0. With --no-stdin it ignores stdin (testscript gives
//       background commands an empty stdin) and holds until a signal. If the
//       database connection is lost while holding, it exits 3.
//   node hold.js --try URL NAME
//       Prints "acquired" (and releases at once) or "held", exits 0.
//
// Errors (bad URL, authentication) go to stderr with exit 1. Usage errors exit 2.
"use strict";

const fs = require("fs");
const advisoryLock = require("advisory-lock").default;

function usage() {
  process.stderr.write(
    "usage: node hold.js [--no-stdin] URL NAME READYFILE\n" +
      "       node hold.js --try URL NAME\n",
  );
  process.exit(2);
}

function fail(err) {
  process.stderr.write(`hold.js: ${err && err.message ? err.message : err}\n`);
  process.exit(1);
}

// The library gives no handle on its pg client; a connection that dies while we
// hold the lock surfaces as an unhandled 'error' event.
let holding = false;
process.on("uncaughtException", (err) => {
  if (holding) {
    process.stderr.write(`hold.js: lock lost: ${err.message}\n`);
    process.exit(3);
  }
  fail(err);
});

async function tryOnce(url, name) {
  const unlock = await advisoryLock(url)(name).tryLock();
  if (unlock) await unlock();
  process.stdout.write(unlock ? "acquired\n" : "held\n");
}

function writeReady(file, text) {
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

async function hold(url, name, readyFile, watchStdin) {
  const unlock = await advisoryLock(url)(name).tryLock();
  if (!unlock) {
    writeReady(readyFile, "held\n");
    return;
  }
  holding = true;
  await new Promise((resolve) => {
    process.once("SIGTERM", resolve);
    process.once("SIGINT", resolve);
    if (watchStdin) {
      process.stdin.once("end", resolve);
      process.stdin.once("close", resolve);
      process.stdin.once("error", resolve);
      process.stdin.resume();
    }
    // Signal handlers are in place before anyone learns we hold the lock.
    writeReady(readyFile, "acquired\n");
  });
  holding = false;
  await unlock();
  process.exit(0);
}

const args = process.argv.slice(2);
if (args[0] === "--try") {
  if (args.length !== 3) usage();
  tryOnce(args[1], args[2]).then(() => process.exit(0), fail);
} else {
  let watchStdin = true;
  if (args[0] === "--no-stdin") {
    watchStdin = false;
    args.shift();
  }
  if (args.length !== 3 || args.some((a) => a.startsWith("--"))) usage();
  hold(args[0], args[1], args[2], watchStdin).then(() => process.exit(0), fail);
}
