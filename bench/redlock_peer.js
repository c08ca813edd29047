#!/usr/bin/env node
// SPDX-License-Identifier: MIT
// redlock_peer.js -- node-redlock (npm `redlock` 5, on `ioredis` clients)
// on the same Redis servers as dlock_bench_redlock: the uncontended cycle
// `redlock.acquire([key], ttl)` then `lock.release()`, with retryCount 0,
// over all the nodes (one ioredis client each) and over the first node
// alone (node-redlock with one client).
//
//   node redlock_peer.js --modules DIR --nodes HOST:PORT,... [--cycles N]
//       [--warmup N]
//     prints one line per set of nodes:
//     node-redlock nodes=5 cycles=N p50_us=X p99_us=Y per_s=Z
//
//   node redlock_peer.js --modules DIR --nodes HOST:PORT,... --serve
//       [--warmup N]
//     for dlock_bench_redlock, which alternates chunks of this with its
//     own: after the warm-up, prints "ready VERSIONS", then reads commands
//     on standard input, one per line:
//       run K N   N cycles on K nodes (K: all of them, or 1); answers
//                 "samples K N NS1 ... NSN", each cycle's time in ns
//       quit
//
//   node redlock_peer.js --modules DIR --nodes HOST:PORT,... --contend NAME
//     one worker of dlock_bench_contend (see bench/bench_contend.c for
//     the protocol) on lock NAME over all the nodes given: node-redlock's
//     default retry, 200 ms +- 100 ms between tries, for as long as it
//     takes (retryCount -1), but given up 10 s after the run's end
//
// DIR is the node_modules directory that holds redlock and ioredis (the
// bench installs them under its build directory, never in the tree).
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');

function fail(msg) {
  process.stderr.write(`redlock_peer: ${msg}\n`);
  process.exit(1);
}

const opt = { cycles: 2000, warmup: 1000, serve: false };
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  const next = () => {
    if (i + 1 >= process.argv.length) fail(`${a} needs a value`);
    return process.argv[++i];
  };
  if (a === '--modules') opt.modules = next();
  else if (a === '--nodes') opt.nodes = next();
  else if (a === '--cycles') opt.cycles = parseInt(next(), 10);
  else if (a === '--warmup') opt.warmup = parseInt(next(), 10);
  else if (a === '--serve') opt.serve = true;
  else if (a === '--contend') opt.contend = next();
  else fail(`unknown argument ${a}`);
}
if (!opt.modules || !opt.nodes) {
  fail('usage: redlock_peer.js --modules DIR --nodes HOST:PORT,... ' +
       '[--cycles N] [--warmup N] [--serve]');
}
opt.modules = path.resolve(opt.modules);

function load(name) {
  try {
    return require(require.resolve(name, { paths: [opt.modules] }));
  } catch (e) {
    return fail(`cannot load ${name} from ${opt.modules}: ${e.message}`);
  }
}
function version(name) {
  // (redlock's "exports" do not export its package.json)
  const file = path.join(opt.modules, name, 'package.json');
  try {
    return JSON.parse(fs.readFileSync(file, 'utf8')).version.replace(/^v/, '');
  } catch (e) {
    return '?';
  }
}

const Redlock = load('redlock').default;
const Redis = load('ioredis');

const TTL_MS = 30000; // as dlock's default lease and the floor's PX

// One cycle at a time, each timed on the monotonic clock.
async function cycles(redlock, key, n, out) {
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    const lock = await redlock.acquire([key], TTL_MS);
    await lock.release();
    if (out) out[i] = Number(process.hrtime.bigint() - t0);
  }
}

function summary(ns) {
  const s = Float64Array.from(ns).sort();
  let sum = 0;
  for (const v of s) sum += v;
  return {
    p50: s[Math.floor(s.length / 2)] / 1000,
    p99: s[Math.floor(s.length * 0.99)] / 1000,
    perS: 1e9 / (sum / s.length),
  };
}

const now = () => process.hrtime.bigint();
const sleepMs = (ms) => new Promise((r) => setTimeout(r, ms));

// The first line of standard input, as a promise.
function firstLine() {
  return new Promise((resolve) => {
    const rl = readline.createInterface({ input: process.stdin });
    rl.once('line', (line) => {
      rl.close();
      resolve(line);
    });
  });
}

// node-redlock's retryCount -1 with its default delay and jitter, as a
// loop of single tries that can give up: null after `until`.
async function acquireUntil(redlock, name, until) {
  for (;;) {
    try {
      return await redlock.acquire([name], TTL_MS);
    } catch (e) {
      if (now() >= until) return null;
      await sleepMs(Math.max(0, 200 + Math.floor((Math.random() * 2 - 1) * 100)));
    }
  }
}

async function contend(clients, name) {
  const redlock = new Redlock(clients, { retryCount: 0 });
  redlock.on('error', () => {}); // failed tries are retried; quiet
  process.stdout.write('ready\n');
  const [start, stop, holdUs] = (await firstLine()).trim().split(/\s+/)
    .map((w) => BigInt(w));
  const out = [];
  if (start > now()) await sleepMs(Number((start - now()) / 1000000n));
  while (now() < stop) {
    const call = now();
    const lock = await acquireUntil(redlock, name, stop + 10000000000n);
    if (!lock) break; // gave up after the end: a quiet end
    const acq = now();
    if (acq >= stop) {
      await lock.release();
      out.push(`e ${call} ${acq}`);
      break;
    }
    await sleepMs(Number(holdUs) / 1000);
    const rel = now();
    await lock.release();
    out.push(`h ${call} ${acq} ${rel}`);
  }
  out.push('end', '');
  await new Promise((r) => process.stdout.write(out.join('\n'), r));
}

async function main() {
  const addrs = opt.nodes.split(',').map((hp) => {
    const k = hp.lastIndexOf(':');
    if (k < 0) fail(`bad node ${hp}: expected HOST:PORT`);
    return { host: hp.slice(0, k), port: parseInt(hp.slice(k + 1), 10) };
  });
  const clients = addrs.map((a) => new Redis({
    host: a.host,
    port: a.port,
    lazyConnect: true,
    maxRetriesPerRequest: 1,
  }));
  for (const c of clients) {
    c.on('error', () => {}); // a failed command rejects; that is enough
  }
  await Promise.all(clients.map((c) => c.connect()));
  if (opt.contend) {
    await contend(clients, opt.contend);
    await Promise.all(clients.map((c) => c.quit()));
    return;
  }

  // retryCount 0: one try, as dlock_acquire(l, 0)
  const sets = new Map();
  sets.set(clients.length, new Redlock(clients, { retryCount: 0 }));
  sets.set(1, new Redlock([clients[0]], { retryCount: 0 }));
  const key = (k) => `bench-node-redlock-${k}`;

  // warm-up: V8 compiles the hot paths; ioredis loads the scripts
  for (const [k, rl] of sets) await cycles(rl, key(k), opt.warmup, null);

  if (!opt.serve) {
    for (const [k, rl] of sets) {
      const ns = new Array(opt.cycles);
      await cycles(rl, key(k), opt.cycles, ns);
      const s = summary(ns);
      process.stdout.write(
        `node-redlock nodes=${k} cycles=${opt.cycles} ` +
        `p50_us=${s.p50.toFixed(1)} p99_us=${s.p99.toFixed(1)} ` +
        `per_s=${s.perS.toFixed(0)}\n`);
    }
    await Promise.all(clients.map((c) => c.quit()));
    return;
  }

  process.stdout.write(`ready redlock=${version('redlock')} ` +
                       `ioredis=${version('ioredis')} ` +
                       `node=${process.versions.node}\n`);
  const rlIn = readline.createInterface({ input: process.stdin });
  for await (const line of rlIn) {
    const w = line.trim().split(/\s+/);
    if (w[0] === 'quit') break;
    if (w[0] !== 'run' || w.length !== 3) fail(`bad command: ${line}`);
    const k = parseInt(w[1], 10), n = parseInt(w[2], 10);
    const rl = sets.get(k);
    if (!rl || !(n > 0)) fail(`bad command: ${line}`);
    const ns = new Array(n);
    await cycles(rl, key(k), n, ns);
    process.stdout.write(`samples ${k} ${n} ${ns.join(' ')}\n`);
  }
  rlIn.close();
  await Promise.all(clients.map((c) => c.quit()));
}

main().then(() => process.exit(0), (e) => fail(e && e.stack ? e.stack : e));
