// Command sarama drives the sarama Kafka client (Debian's golang-github-shopify-sarama-dev,
// sarama 1.22) against a broker for tests/kafka/test_kafka_sarama.py.  Built in GOPATH mode,
// offline, by tests/support/sarama.py.
//
// Every subcommand writes one JSON object per line on stdout (an "event" key says what it is)
// and exits 0 when it did what it was asked, 1 on an error (an "error" event says which).
//
//	admin   -brokers B -topic T -partitions N     create T, create it again, describe it
//	                                               and T-missing, its configs, list topics
//	produce -brokers B -topic T -count N -prefix P [-retries R] [-compression C] [-batched]
//	        [-max-bytes M]
//	                                               idempotent producer, one "ack" per record
//	                                               (-batched: the async producer, 50 a batch)
//	read    -brokers B -topic T -expect N [-idle S]
//	                                               every record of T from the oldest offset
//	group   -brokers B -topic T -group G [-retention D]
//	                                               a consumer group member until SIGTERM
//	manage  -brokers B -topic T -group G -scratch S -partitions N
//	                                               list and describe groups, G's offset of T/0,
//	                                               grow S to N partitions, delete S
//	acls    -brokers B -user U -password P -topic T
//	                                               create, list, delete an ACL binding (SASL/PLAIN)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/Shopify/sarama"
)

var outLock sync.Mutex

func emit(event string, fields map[string]interface{}) {
	if fields == nil {
		fields = map[string]interface{}{}
	}
	fields["event"] = event
	line, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	outLock.Lock()
	defer outLock.Unlock()
	os.Stdout.Write(append(line, '\n'))
}

func fail(what string, err error) {
	emit("error", map[string]interface{}{"what": what, "error": err.Error()})
	os.Exit(1)
}

// baseConfig: V1_0_0_0 is the lowest version at which sarama 1.22 speaks only what Kafka 4
// serves (Produce 3, Fetch 4, Metadata 5, CreateTopics 2; docs/kafka.md, "Per client").
func baseConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V1_0_0_0
	c.ClientID = "sarama-test"
	c.Metadata.Retry.Max = 50
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	c.Net.DialTimeout = 5 * time.Second
	return c
}

func brokerList(s string) []string { return strings.Split(s, ",") }

func headerMap(hs []*sarama.RecordHeader) map[string]string {
	out := map[string]string{}
	for _, h := range hs {
		out[string(h.Key)] = string(h.Value)
	}
	return out
}

func record(event string, m *sarama.ConsumerMessage, extra map[string]interface{}) {
	fields := map[string]interface{}{
		"topic": m.Topic, "partition": m.Partition, "offset": m.Offset,
		"key": string(m.Key), "value": string(m.Value), "headers": headerMap(m.Headers),
	}
	for k, v := range extra {
		fields[k] = v
	}
	emit(event, fields)
}

func admin(args []string) {
	fs := flag.NewFlagSet("admin", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	topic := fs.String("topic", "", "topic to create")
	partitions := fs.Int("partitions", 1, "partitions")
	fs.Parse(args)

	ca, err := sarama.NewClusterAdmin(brokerList(*brokers), baseConfig())
	if err != nil {
		fail("cluster admin", err)
	}
	defer ca.Close()
	detail := &sarama.TopicDetail{NumPartitions: int32(*partitions), ReplicationFactor: 1}
	if err := ca.CreateTopic(*topic, detail, false); err != nil {
		fail("create topic", err)
	}
	again := ca.CreateTopic(*topic, detail, false)
	emit("created", map[string]interface{}{"topic": *topic, "again": fmt.Sprint(again),
		"again_exists": errors.Is(again, sarama.ErrTopicAlreadyExists) || isTopicError(again, sarama.ErrTopicAlreadyExists)})
	// a topic that does not exist is described as such, and not created (sarama asks
	// Metadata v5 with AllowAutoTopicCreation false)
	metas, err := ca.DescribeTopics([]string{*topic, *topic + "-missing"})
	if err != nil {
		fail("describe topics", err)
	}
	for _, m := range metas {
		parts := []int32{}
		leaders := []int32{}
		for _, p := range m.Partitions {
			parts = append(parts, p.ID)
			leaders = append(leaders, p.Leader)
		}
		emit("described", map[string]interface{}{"topic": m.Name, "error": int(m.Err),
			"partitions": parts, "leaders": leaders})
	}
	// DescribeConfig and ListTopics send DescribeConfigs v0 (Kafka 3.9's; Kafka 4 serves from 1)
	entries, err := ca.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: *topic})
	if err != nil {
		fail("describe config", err)
	}
	configs := map[string]interface{}{}
	for _, e := range entries {
		configs[e.Name] = map[string]interface{}{"value": e.Value, "default": e.Default,
			"read_only": e.ReadOnly}
	}
	emit("configs", map[string]interface{}{"topic": *topic, "configs": configs})
	listed, err := ca.ListTopics()
	if err != nil {
		fail("list topics", err)
	}
	mine := listed[*topic]
	nonDefault := map[string]string{}
	for name, value := range mine.ConfigEntries {
		nonDefault[name] = *value
	}
	emit("listed", map[string]interface{}{"topic": *topic, "partitions": mine.NumPartitions,
		"replication": mine.ReplicationFactor, "configs": nonDefault})
	brokers2, controller, err := ca.DescribeCluster()
	if err != nil {
		fail("describe cluster", err)
	}
	emit("cluster", map[string]interface{}{"brokers": len(brokers2), "controller": controller})
}

// manage: the other admin calls sarama 1.22 makes over APIs Kafka 4 still serves.
func manage(args []string) {
	fs := flag.NewFlagSet("manage", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	topic := fs.String("topic", "", "topic whose partition 0 offset of -group is read")
	scratch := fs.String("scratch", "", "topic to grow to -partitions, then delete")
	partitions := fs.Int("partitions", 2, "partitions after growing")
	groupID := fs.String("group", "", "group to list, describe and read the offsets of")
	fs.Parse(args)

	ca, err := sarama.NewClusterAdmin(brokerList(*brokers), baseConfig())
	if err != nil {
		fail("cluster admin", err)
	}
	defer ca.Close()
	groups, err := ca.ListConsumerGroups()
	if err != nil {
		fail("list consumer groups", err)
	}
	emit("groups", map[string]interface{}{"groups": groups})
	descs, err := ca.DescribeConsumerGroups([]string{*groupID})
	if err != nil {
		fail("describe consumer groups", err)
	}
	for _, d := range descs {
		members := map[string]interface{}{}
		for id, m := range d.Members {
			assignment, err := m.GetMemberAssignment()
			if err != nil {
				fail("member assignment", err)
			}
			metadata, err := m.GetMemberMetadata()
			if err != nil {
				fail("member metadata", err)
			}
			members[id] = map[string]interface{}{"client_id": m.ClientId,
				"assigned": assignment.Topics, "subscribed": metadata.Topics}
		}
		emit("group", map[string]interface{}{"group": d.GroupId, "error": int(d.Err), "state": d.State,
			"protocol_type": d.ProtocolType, "protocol": d.Protocol, "members": members})
	}
	offsets, err := ca.ListConsumerGroupOffsets(*groupID, map[string][]int32{*topic: {0}})
	if err != nil {
		fail("list consumer group offsets", err)
	}
	block := offsets.GetBlock(*topic, 0)
	emit("offsets", map[string]interface{}{"offset": block.Offset, "error": int(block.Err)})
	if err := ca.CreatePartitions(*scratch, int32(*partitions), nil, false); err != nil {
		fail("create partitions", err)
	}
	metas, err := ca.DescribeTopics([]string{*scratch})
	if err != nil {
		fail("describe topics", err)
	}
	emit("grown", map[string]interface{}{"partitions": len(metas[0].Partitions)})
	if err := ca.DeleteTopic(*scratch); err != nil {
		fail("delete topic", err)
	}
	metas, err = ca.DescribeTopics([]string{*scratch})
	if err != nil {
		fail("describe topics", err)
	}
	emit("deleted", map[string]interface{}{"error": int(metas[0].Err)})
}

// acls: create, list and delete an ACL binding as a SASL/PLAIN user (sarama 1.22 sends
// v0 of the three ACL APIs, Kafka 3.9's; Kafka 4 serves them from 1).
func acls(args []string) {
	fs := flag.NewFlagSet("acls", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	user := fs.String("user", "", "SASL/PLAIN user")
	password := fs.String("password", "", "SASL/PLAIN password")
	topic := fs.String("topic", "", "the topic of the binding")
	fs.Parse(args)

	c := baseConfig()
	c.Net.SASL.Enable = true
	c.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	c.Net.SASL.Handshake = true
	c.Net.SASL.User, c.Net.SASL.Password = *user, *password
	ca, err := sarama.NewClusterAdmin(brokerList(*brokers), c)
	if err != nil {
		fail("cluster admin", err)
	}
	defer ca.Close()
	resource := sarama.Resource{ResourceType: sarama.AclResourceTopic, ResourceName: *topic}
	acl := sarama.Acl{Principal: "User:bob", Host: "*", Operation: sarama.AclOperationRead,
		PermissionType: sarama.AclPermissionAllow}
	if err := ca.CreateACL(resource, acl); err != nil {
		fail("create acl", err)
	}
	filter := sarama.AclFilter{ResourceType: sarama.AclResourceTopic,
		Operation: sarama.AclOperationAny, PermissionType: sarama.AclPermissionAny}
	list := func(event string) {
		found, err := ca.ListAcls(filter)
		if err != nil {
			fail("list acls", err)
		}
		out := []string{}
		for _, r := range found {
			for _, a := range r.Acls {
				out = append(out, fmt.Sprintf("%s %s %d %d", r.ResourceName, a.Principal,
					a.Operation, a.PermissionType))
			}
		}
		emit(event, map[string]interface{}{"acls": out})
	}
	list("listed")
	matched, err := ca.DeleteACL(filter, false)
	if err != nil {
		fail("delete acl", err)
	}
	deleted := []string{}
	for _, m := range matched {
		deleted = append(deleted, fmt.Sprintf("%s %s %d", m.ResourceName, m.Principal, m.Err))
	}
	emit("deleted", map[string]interface{}{"acls": deleted})
	list("after")
}

func isTopicError(err error, want sarama.KError) bool {
	te, ok := err.(*sarama.TopicError)
	return ok && te.Err == want
}

func produce(args []string) {
	fs := flag.NewFlagSet("produce", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	topic := fs.String("topic", "", "topic")
	count := fs.Int("count", 10, "records to send")
	prefix := fs.String("prefix", "v", "value prefix")
	retries := fs.Int("retries", 3, "producer retries per record")
	compression := fs.String("compression", "none", "none, gzip, snappy or lz4")
	batched := fs.Bool("batched", false, "the async producer, several records per batch")
	maxBytes := fs.Int("max-bytes", 0, "Producer.MaxMessageBytes, the largest batch (0: sarama's 1000000)")
	fs.Parse(args)

	c := baseConfig()
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Retry.Max = *retries
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Partitioner = sarama.NewHashPartitioner
	if *maxBytes > 0 {
		c.Producer.MaxMessageBytes = *maxBytes
	}
	codecs := map[string]sarama.CompressionCodec{"none": sarama.CompressionNone,
		"gzip": sarama.CompressionGZIP, "snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4}
	codec, ok := codecs[*compression]
	if !ok {
		fail("compression", fmt.Errorf("unknown codec %q", *compression))
	}
	c.Producer.Compression = codec
	message := func(i int) *sarama.ProducerMessage {
		return &sarama.ProducerMessage{
			Topic: *topic,
			Key:   sarama.StringEncoder(fmt.Sprintf("k-%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("%s-%d", *prefix, i)),
			Headers: []sarama.RecordHeader{
				{Key: []byte("idx"), Value: []byte(strconv.Itoa(i))},
				{Key: []byte("src"), Value: []byte("sarama")},
			},
		}
	}
	if *batched {
		produceBatched(c, *brokers, *count, message)
		return
	}
	p, err := sarama.NewSyncProducer(brokerList(*brokers), c)
	if err != nil {
		fail("producer", err)
	}
	acked, failed := 0, 0
	for i := 0; i < *count; i++ {
		msg := message(i)
		value := fmt.Sprintf("%s-%d", *prefix, i)
		partition, offset, err := p.SendMessage(msg)
		if err != nil {
			failed++
			emit("failed", map[string]interface{}{"value": value, "error": err.Error()})
			continue
		}
		acked++
		emit("ack", map[string]interface{}{"value": value, "partition": partition, "offset": offset})
	}
	if err := p.Close(); err != nil {
		emit("close-error", map[string]interface{}{"error": err.Error()})
	}
	emit("done", map[string]interface{}{"acked": acked, "failed": failed})
}

// produceBatched sends every record through the async producer, which puts up to 50 records
// of a partition in one batch (one sequence range per batch), and reports each outcome.
func produceBatched(c *sarama.Config, brokers string, count int, message func(int) *sarama.ProducerMessage) {
	c.Producer.Flush.Messages = 50
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	p, err := sarama.NewAsyncProducer(brokerList(brokers), c)
	if err != nil {
		fail("producer", err)
	}
	go func() {
		for i := 0; i < count; i++ {
			p.Input() <- message(i)
		}
	}()
	acked, failed := 0, 0
	for acked+failed < count {
		select {
		case m := <-p.Successes():
			acked++
			value, _ := m.Value.Encode()
			emit("ack", map[string]interface{}{"value": string(value), "partition": m.Partition,
				"offset": m.Offset})
		case e := <-p.Errors():
			failed++
			value, _ := e.Msg.Value.Encode()
			emit("failed", map[string]interface{}{"value": string(value), "error": e.Err.Error()})
		}
	}
	if err := p.Close(); err != nil {
		emit("close-error", map[string]interface{}{"error": err.Error()})
	}
	emit("done", map[string]interface{}{"acked": acked, "failed": failed})
}

func read(args []string) {
	fs := flag.NewFlagSet("read", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	topic := fs.String("topic", "", "topic")
	expect := fs.Int("expect", 0, "stop after this many records")
	idle := fs.Float64("idle", 10, "stop after this many seconds without a record")
	fs.Parse(args)

	c := baseConfig()
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	consumer, err := sarama.NewConsumer(brokerList(*brokers), c)
	if err != nil {
		fail("consumer", err)
	}
	defer consumer.Close()
	parts, err := consumer.Partitions(*topic)
	if err != nil {
		fail("partitions", err)
	}
	msgs := make(chan *sarama.ConsumerMessage)
	for _, part := range parts {
		pc, err := consumer.ConsumePartition(*topic, part, sarama.OffsetOldest)
		if err != nil {
			fail("consume partition", err)
		}
		defer pc.Close()
		go func(pc sarama.PartitionConsumer) {
			for m := range pc.Messages() {
				msgs <- m
			}
		}(pc)
	}
	got := 0
	timer := time.NewTimer(time.Duration(*idle * float64(time.Second)))
	for got < *expect {
		select {
		case m := <-msgs:
			got++
			record("rec", m, nil)
			timer.Reset(time.Duration(*idle * float64(time.Second)))
		case <-timer.C:
			emit("idle", map[string]interface{}{"got": got})
			return
		}
	}
	emit("done", map[string]interface{}{"got": got})
}

type member struct{}

func (member) Setup(s sarama.ConsumerGroupSession) error {
	claims := map[string][]int32{}
	for t, ps := range s.Claims() {
		sorted := append([]int32(nil), ps...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
		claims[t] = sorted
	}
	emit("setup", map[string]interface{}{"member": s.MemberID(), "generation": s.GenerationID(),
		"claims": claims})
	return nil
}

func (member) Cleanup(s sarama.ConsumerGroupSession) error {
	emit("cleanup", map[string]interface{}{"generation": s.GenerationID()})
	return nil
}

func (member) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		record("rec", m, map[string]interface{}{"generation": s.GenerationID()})
		s.MarkMessage(m, "")
	}
	return nil
}

func group(args []string) {
	fs := flag.NewFlagSet("group", flag.ExitOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers")
	topic := fs.String("topic", "", "topic")
	groupID := fs.String("group", "", "group id")
	retention := fs.Duration("retention", 0, "offset retention (0: commits are OffsetCommit v1)")
	fs.Parse(args)

	c := baseConfig()
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
	// sarama 1.22 commits with OffsetCommit v1 unless a retention is set (then v2); Kafka 4
	// no longer serves v1, txbroker does (docs/kafka.md, "Versions").
	c.Consumer.Offsets.Retention = *retention
	c.Consumer.Return.Errors = true
	c.Consumer.Group.Session.Timeout = 10 * time.Second
	c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	c.Consumer.Group.Rebalance.Timeout = 20 * time.Second
	c.Consumer.Group.Rebalance.Strategy = sarama.BalanceStrategyRange
	g, err := sarama.NewConsumerGroup(brokerList(*brokers), *groupID, c)
	if err != nil {
		fail("consumer group", err)
	}
	go func() {
		for err := range g.Errors() {
			emit("group-error", map[string]interface{}{"error": err.Error()})
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		cancel()
	}()
	for ctx.Err() == nil {
		if err := g.Consume(ctx, []string{*topic}, member{}); err != nil {
			emit("consume-error", map[string]interface{}{"error": err.Error()})
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := g.Close(); err != nil {
		fail("close", err)
	}
	emit("closed", nil)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sarama admin|produce|read|group [flags]")
		os.Exit(2)
	}
	sarama.Logger = nopLogger{}
	if os.Getenv("SARAMA_LOG") != "" {
		sarama.Logger = stderrLogger{}
	}
	switch os.Args[1] {
	case "admin":
		admin(os.Args[2:])
	case "produce":
		produce(os.Args[2:])
	case "read":
		read(os.Args[2:])
	case "manage":
		manage(os.Args[2:])
	case "acls":
		acls(os.Args[2:])
	case "group":
		group(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", os.Args[1])
		os.Exit(2)
	}
}

type nopLogger struct{}

func (nopLogger) Print(...interface{})          {}
func (nopLogger) Printf(string, ...interface{}) {}
func (nopLogger) Println(...interface{})        {}

type stderrLogger struct{}

func (stderrLogger) Print(v ...interface{})            { fmt.Fprint(os.Stderr, v...) }
func (stderrLogger) Printf(f string, v ...interface{}) { fmt.Fprintf(os.Stderr, f, v...) }
func (stderrLogger) Println(v ...interface{})          { fmt.Fprintln(os.Stderr, v...) }
