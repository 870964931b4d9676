'use strict';
/*
 * Drive the unmodified RocketMQ 5.x Node.js client (npm rocketmq-client-nodejs, pinned in
 * tests/grpc/node5/package-lock.json and installed by the tests into a cache directory named
 * by NODE_PATH) for one scenario, in its own process.  Prints one JSON object per line (what
 * happened), {"done": true} last; the client's own log goes to stderr.  Every wait is bounded
 * by DEADLINE_MS, and the whole scenario by DEADLINE_MS + 10 s: past it, an "error" event and
 * exit code 1.
 *
 * Scenarios (ENDPOINT is host:port of txbroker's gRPC endpoint):
 *
 *   send ENDPOINT TOPIC N [--tag T] [--group G] [--prefix P] [--deliver-ms MS] [--recall-first]
 *       N messages (FIFO messages of group G with --group, DELAY messages due at epoch
 *       millisecond MS with --deliver-ms, each sent's recall handle printed); TOPIC may be
 *       T1,T2,...: the producer is given every one at start-up and sends to the first; with
 *       --recall-first, RecallMessage of the first message, twice (each outcome printed);
 *   tx ENDPOINT TOPIC N --end commit|rollback|none
 *       N transactions of one half each, ended as asked; "none" leaves them open and waits to
 *       be killed (an orphaned transaction);
 *   check ENDPOINT TOPIC N --answer commit|rollback
 *       a producer whose checker answers every check-back and prints it, until N came;
 *   receive ENDPOINT TOPIC GROUP N [--tag T] [--invisible-ms MS]
 *       a SimpleConsumer receiving and acking until N messages were acked ("receiving" is
 *       printed before each receive call);
 *   push ENDPOINT TOPIC GROUP N [--tag T] [--fail-first]
 *       a PushConsumer whose listener prints and succeeds, until N were consumed; with
 *       --fail-first it fails each message the first time it sees it ("failed").
 *
 * --ak KEY --sk SECRET give every client those session credentials: each call is signed.
 */

const { format } = require('node:util');

const DEADLINE_MS = 60000;
/* How long a PushConsumer's shutdown is waited for (see push()). */
const SHUTDOWN_WAIT_MS = 3000;

const {
  Producer, SimpleConsumer, PushConsumer, ConsumeResult,
} = require('rocketmq-client-nodejs');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function fail(message) {
  emit({ error: message });
  process.exit(1);
}

/* The client's log to stderr (its default writes under ~/logs).  ``debug`` must exist although
 * the client's ILogger declares it optional: Transaction.commit/rollback call it unguarded. */
function line(level, args) {
  process.stderr.write(`${level} ${format(...args)}\n`);
}
const logger = {
  info: (...args) => line('INFO', args),
  warn: (...args) => line('WARN', args),
  error: (...args) => line('ERROR', args),
  debug: () => {},
};

function parse(argv) {
  const [ scenario, endpoint, topic, ...rest ] = argv;
  const args = {
    scenario, endpoint, topic, tag: 't', group: '', prefix: 'm', end: 'commit',
    answer: 'commit', invisibleMs: 10000, positional: [],
  };
  for (let i = 0; i < rest.length; i++) {
    const flag = rest[i];
    const value = rest[i + 1];
    switch (flag) {
      case '--tag': args.tag = value; i++; break;
      case '--group': args.group = value; i++; break;
      case '--prefix': args.prefix = value; i++; break;
      case '--end': args.end = value; i++; break;
      case '--answer': args.answer = value; i++; break;
      case '--invisible-ms': args.invisibleMs = parseInt(value, 10); i++; break;
      case '--fail-first': args.failFirst = true; break;
      case '--deliver-ms': args.deliverMs = parseInt(value, 10); i++; break;
      case '--recall-first': args.recallFirst = true; break;
      case '--ak': args.ak = value; i++; break;
      case '--sk': args.sk = value; i++; break;
      default: args.positional.push(flag);
    }
  }
  if (![ 'send', 'tx', 'check', 'receive', 'push' ].includes(scenario) || !endpoint || !topic) {
    fail(`usage: send|tx|check|receive|push ENDPOINT TOPIC ...; got ${JSON.stringify(argv)}`);
  }
  return args;
}

/* The client options every scenario shares: endpoint, timeout, log, credentials if given. */
function common(args) {
  const options = { endpoints: args.endpoint, namespace: '', requestTimeout: 10000, logger };
  if (args.ak) options.sessionCredentials = { accessKey: args.ak, accessSecret: args.sk };
  return options;
}

function view(m) {
  return {
    id: m.messageId, topic: m.topic, body: m.body.toString(), tag: m.tag ?? null,
    keys: m.keys, group: m.messageGroup ?? null, attempt: m.deliveryAttempt ?? null,
    properties: Object.fromEntries(m.properties), corrupted: m.corrupted === true,
  };
}

/* A startup that never hears its settings waits forever: bound it. */
async function started(client) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`startup took over ${DEADLINE_MS} ms`)), DEADLINE_MS);
  });
  try {
    await Promise.race([ client.startup(), timeout ]);
  } finally {
    clearTimeout(timer);
  }
  emit({ started: true });
}

function message(args, i) {
  const m = {
    topic: args.topic.split(',')[0], body: Buffer.from(`${args.prefix}-${i}`), tag: args.tag, keys: [ `k${i}` ],
    properties: new Map([ [ 'n', String(i) ] ]),
  };
  if (args.group) m.messageGroup = args.group;
  if (args.deliverMs) m.deliveryTimestamp = new Date(args.deliverMs);
  return m;
}

async function produce(args, n) {
  let seen = 0;
  let enough;
  const allChecked = new Promise(resolve => { enough = resolve; });
  const checker = {
    async check(m) {
      seen++;
      emit({ check: m.messageId, topic: m.topic, body: m.body.toString(), corrupted: m.corrupted === true });
      if (seen >= n) enough();
      return args.answer === 'commit' ? TransactionResolution.COMMIT : TransactionResolution.ROLLBACK;
    },
  };
  const producer = new Producer({
    ...common(args), topic: args.topic.split(','),
    checker: args.scenario === 'send' ? undefined : checker,
  });
  await started(producer);
  if (args.scenario === 'send') {
    const receipts = [];
    for (let i = 0; i < n; i++) {
      const receipt = await producer.send(message(args, i));
      receipts.push(receipt);
      emit({ sent: receipt.messageId, i, offset: Number(receipt.offset),
        recall_handle: receipt.recallHandle || null });
    }
    for (let attempt = 0; args.recallFirst && attempt < 2; attempt++) {
      try {
        const recalled = await producer.recallMessage(message(args, 0).topic, receipts[0].recallHandle);
        emit({ recalled: recalled.messageId, attempt });
      } catch (err) {
        emit({ recall_failed: String(err && err.message || err), attempt });
      }
    }
  } else if (args.scenario === 'tx') {
    for (let i = 0; i < n; i++) {
      const tx = producer.beginTransaction();
      const receipt = await producer.send(message(args, i), tx);
      emit({ half: receipt.messageId, transaction_id: receipt.transactionId, i });
      if (args.end === 'commit') await tx.commit();
      else if (args.end === 'rollback') await tx.rollback();
      emit({ ended: receipt.messageId, how: args.end });
    }
    if (args.end === 'none') {
      await new Promise(resolve => setTimeout(resolve, DEADLINE_MS)); // killed here
      fail('an orphaning producer was not killed');
    }
  } else {
    await allChecked;
    await new Promise(resolve => setTimeout(resolve, 500)); // the last answer goes out
  }
  await producer.shutdown();
}

async function receive(args, group, n) {
  const consumer = new SimpleConsumer({
    ...common(args), consumerGroup: group,
    subscriptions: new Map([ [ args.topic, args.tag ] ]), awaitDuration: 5000,
  });
  await started(consumer);
  let acked = 0;
  const until = Date.now() + DEADLINE_MS;
  while (acked < n && Date.now() < until) {
    emit({ receiving: acked });
    const messages = await consumer.receive(Math.min(32, n - acked), args.invisibleMs);
    for (const m of messages) {
      emit({ received: m.messageId, ...view(m) });
      await consumer.ack(m);
      acked++;
      emit({ acked: m.messageId });
    }
  }
  if (acked < n) fail(`${acked} of ${n} messages within ${DEADLINE_MS} ms`);
  await consumer.shutdown();
}

async function push(args, group, n) {
  const failed = new Set();
  let consumed = 0;
  let enough;
  const allConsumed = new Promise(resolve => { enough = resolve; });
  const consumer = new PushConsumer({
    ...common(args), consumerGroup: group,
    subscriptions: new Map([ [ args.topic, args.tag ] ]),
    messageListener: {
      async consume(m) {
        if (args.failFirst && !failed.has(m.messageId)) {
          failed.add(m.messageId);
          emit({ failed: m.messageId, ...view(m) });
          return ConsumeResult.FAILURE;
        }
        emit({ consumed: m.messageId, ...view(m) });
        if (++consumed >= n) enough();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await started(consumer);
  await allConsumed;
  // shutdown() waits for the receive in flight, a long poll of up to 20 s: the acks of what was
  // consumed go out at once, so a few seconds of it are enough.
  await Promise.race([ consumer.shutdown(), new Promise(resolve => setTimeout(resolve, SHUTDOWN_WAIT_MS)) ]);
}

async function main() {
  const args = parse(process.argv.slice(2));
  const deadline = setTimeout(() => fail(`scenario ${args.scenario} ran over ${DEADLINE_MS} ms`),
    DEADLINE_MS + 10000);
  const [ first, second ] = args.positional;
  if (args.scenario === 'receive') await receive(args, first, parseInt(second, 10));
  else if (args.scenario === 'push') await push(args, first, parseInt(second, 10));
  else await produce(args, parseInt(first, 10));
  clearTimeout(deadline);
  emit({ done: true });
  process.exit(0);
}

main().catch(err => fail(err && err.stack ? err.stack : String(err)));
