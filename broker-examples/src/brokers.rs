//! The brokers as the examples set them up: a connection to each that names its address
//! when it fails, a RabbitMQ quorum queue with its dead-letter queue, a JetStream stream
//! with the durable pull consumer the consumer processes share.

use std::time::Duration;

use async_nats::ConnectOptions;
use async_nats::jetstream::consumer::{PullConsumer, pull};
use async_nats::jetstream::{Context, stream};
use inbox_nats::Unreachable;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::without_password;

/// A connection to RabbitMQ, or a message naming the address and what failed.
pub async fn connect_rabbitmq(url: &str) -> Result<Connection, String> {
    let shown = without_password(url);
    match tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(url, ConnectionProperties::default()),
    )
    .await
    {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(format!(
            "RabbitMQ is not reachable at {shown} (set AMQP_URL to change it): {e}"
        )),
        Err(_) => Err(format!(
            "RabbitMQ at {shown} (AMQP_URL) did not answer within 10 s"
        )),
    }
}

/// JetStream on the NATS server at `url`, or a message naming the address and what failed.
pub async fn connect_nats(url: &str) -> Result<Context, String> {
    let shown = without_password(url);
    match tokio::time::timeout(
        Duration::from_secs(10),
        inbox_nats::connect(url, ConnectOptions::new()),
    )
    .await
    {
        Ok(Ok(jetstream)) => Ok(jetstream),
        Ok(Err(Unreachable::NoJetStream { .. })) => Err(format!(
            "the NATS server at {shown} runs without JetStream: start it with \
             `nats-server -js`, or set NATS_URL to one that has it"
        )),
        Ok(Err(e)) => Err(format!(
            "NATS is not reachable at {shown} (set NATS_URL to change it): {}",
            std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string)
        )),
        Err(_) => Err(format!(
            "NATS at {shown} (NATS_URL) did not answer within 10 s"
        )),
    }
}

/// A quorum queue — delivery counts in `x-delivery-count`, redeliveries bounded — and its
/// dead-letter queue.
pub struct Queues {
    pub name: String,
    pub dead: String,
}

impl Queues {
    /// Declares `name` (durable, quorum, at most 10 deliveries of a message, then to the
    /// dead-letter queue) and `<name>-dead`; a queue a run abandons goes after 10 minutes
    /// unused. If either cannot be declared, both are deleted again.
    pub async fn declare(channel: &Channel, name: String) -> Result<Self, String> {
        let dead = format!("{name}-dead");
        let durable = QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        };
        // Queues a run abandons (an orchestrator interrupted) go after 10 minutes unused.
        let mut expiring = FieldTable::default();
        expiring.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        let mut arguments = expiring.clone();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString("quorum".into()),
        );
        arguments.insert("x-delivery-limit".into(), AMQPValue::LongInt(10));
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(dead.as_str().into()),
        );
        let queues = Self { name, dead };
        for (queue, arguments) in [(&queues.dead, expiring), (&queues.name, arguments)] {
            if let Err(e) = channel
                .queue_declare(queue.as_str().into(), durable, arguments)
                .await
            {
                for queue in [&queues.name, &queues.dead] {
                    let _ = channel
                        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await;
                }
                return Err(format!("declare the queue {queue}: {e}"));
            }
        }
        Ok(queues)
    }

    /// One persistent copy of the message `id` (its body and `message_id`) to the queue,
    /// confirmed by the broker before this returns.
    pub async fn publish_one(&self, channel: &Channel, id: &str) -> Result<(), String> {
        let confirmation = channel
            .basic_publish(
                "".into(),
                self.name.as_str().into(),
                BasicPublishOptions::default(),
                id.as_bytes(),
                BasicProperties::default()
                    .with_message_id(id.into())
                    .with_delivery_mode(2),
            )
            .await
            .map_err(|e| format!("publish {id}: {e}"))?
            .await
            .map_err(|e| format!("publish {id}: {e}"))?;
        match confirmation.is_ack() {
            true => Ok(()),
            false => Err(format!("RabbitMQ refused {id}: {confirmation:?}")),
        }
    }

    /// Messages waiting in `queue` for a consumer (not those delivered and unacknowledged).
    pub async fn ready(channel: &Channel, queue: &str) -> Result<u64, String> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map(|queue| u64::from(queue.message_count()))
            .map_err(|e| format!("ask for the length of {queue}: {e}"))
    }

    pub async fn delete(&self, channel: &Channel) {
        for queue in [&self.name, &self.dead] {
            if let Err(e) = channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await
            {
                eprintln!("delete the queue {queue}: {e}");
            }
        }
    }
}

/// A stream in memory taking the subjects `<name>.>`, and the durable pull consumer the
/// consumer processes share.
pub struct Stream {
    pub name: String,
    pub durable: String,
    consumer: PullConsumer,
}

impl Stream {
    /// The stream `name`, in memory, dropping a message published again with the same
    /// `Nats-Msg-Id` within `duplicate_window` (refused if the server gives it another) and
    /// keeping messages at most `max_age` (a run abandoned leaves nothing for long), and the
    /// durable consumer `<name>-consumer` as `consumer` configures it for that name (a
    /// pump's `consumer_config`). The stream is deleted again if the consumer cannot be made.
    pub async fn create(
        jetstream: &Context,
        name: String,
        duplicate_window: Duration,
        max_age: Duration,
        consumer: impl FnOnce(&str) -> pull::Config,
    ) -> Result<Self, String> {
        let durable = format!("{name}-consumer");
        // A stream of an earlier run under the same process id.
        let _ = jetstream.delete_stream(&name).await;
        let created = jetstream
            .create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.>")],
                storage: stream::StorageType::Memory,
                duplicate_window,
                max_age,
                ..stream::Config::default()
            })
            .await
            .map_err(|e| format!("create the stream {name}: {e}"))?;
        let window = created.cached_info().config.duplicate_window;
        let consumer = if window == duplicate_window {
            jetstream
                .create_consumer_on_stream(consumer(&durable), &name)
                .await
                .map_err(|e| format!("create the consumer {durable} on {name}: {e}"))
        } else {
            Err(format!(
                "the server gave the stream {name} a duplicate window of {window:?}, not \
                 {duplicate_window:?}: the copies published again inside it would be stored, \
                 and a retry after it dropped"
            ))
        };
        match consumer {
            Ok(consumer) => Ok(Self {
                name,
                durable,
                consumer,
            }),
            Err(e) => {
                let _ = jetstream.delete_stream(&name).await;
                Err(e)
            }
        }
    }

    /// Messages the consumer has not delivered yet, and those delivered and not yet
    /// acknowledged (a killed consumer's, until `ack_wait` passes).
    pub async fn pending(&self) -> Result<u64, String> {
        let info = self
            .consumer
            .get_info()
            .await
            .map_err(|e| format!("ask for the state of the consumer {}: {e}", self.durable))?;
        Ok(info.num_pending + info.num_ack_pending as u64)
    }

    /// Messages the stream stored.
    pub async fn stored(&self, jetstream: &Context) -> Result<u64, String> {
        let mut stream = jetstream
            .get_stream(&self.name)
            .await
            .map_err(|e| format!("the stream {}: {e}", self.name))?;
        let info = stream
            .info()
            .await
            .map_err(|e| format!("ask for the state of the stream {}: {e}", self.name))?;
        Ok(info.state.messages)
    }

    pub async fn delete(&self, jetstream: &Context) {
        if let Err(e) = jetstream.delete_stream(&self.name).await {
            eprintln!("delete the stream {}: {e}", self.name);
        }
    }
}

/// The Kafka brokers of a run: `KAFKA_BROKERS`, or a private tansu broker (an Apache
/// Kafka-compatible broker; `TANSU`, else `tansu` on the PATH) on a free port, its storage in
/// memory, killed when this is dropped.
pub struct Kafka {
    /// The bootstrap list the clients connect to.
    pub bootstrap: String,
    tansu: Option<(std::process::Child, tempfile::TempDir)>,
}

impl Kafka {
    /// `KAFKA_BROKERS` if set, else a private tansu broker, started and listening.
    pub async fn start() -> Result<Self, String> {
        if let Some(bootstrap) = crate::kafka_brokers() {
            return Ok(Self {
                bootstrap,
                tansu: None,
            });
        }
        let program = std::env::var("TANSU").unwrap_or_else(|_| "tansu".to_owned());
        let dir = tempfile::tempdir().map_err(|e| format!("a directory for tansu: {e}"))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("a free port for tansu: {e}"))?
            .port();
        let bootstrap = format!("127.0.0.1:{port}");
        let url = format!("tcp://{bootstrap}");
        let child = std::process::Command::new(&program)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "set KAFKA_BROKERS to your Kafka brokers, or TANSU to a tansu binary to start \
                     a private one (`{program}` did not start: {e})"
                )
            })?;
        let kafka = Self {
            bootstrap,
            tansu: Some((child, dir)),
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(&kafka.bootstrap)
                .await
                .is_ok()
            {
                return Ok(kafka);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!(
            "tansu did not listen on {} within 10 s",
            kafka.bootstrap
        ))
    }

    /// What [`Kafka::start`] connected to, for the run's header.
    pub fn describe(&self) -> String {
        match self.tansu {
            Some(_) => format!("tansu at {} (private, in memory)", self.bootstrap),
            None => format!("Kafka at {} (KAFKA_BROKERS)", self.bootstrap),
        }
    }

    /// Creates `topic` with `partitions` partitions (one replica each).
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), String> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .create()
                .map_err(|e| format!("a Kafka admin client for {}: {e}", self.bootstrap))?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = admin
            .create_topics(
                &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
                &options,
            )
            .await
            .map_err(|e| format!("create the topic {topic} on {}: {e}", self.bootstrap))?;
        for result in results {
            result.map_err(|(topic, e)| format!("create the topic {topic}: {e}"))?;
        }
        Ok(())
    }

    /// Deletes `topic` (on brokers the run did not start; a private broker goes with its
    /// process).
    pub async fn delete_topic(&self, topic: &str) {
        use rdkafka::admin::{AdminClient, AdminOptions};
        if self.tansu.is_some() {
            return;
        }
        if let Ok(admin) = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create::<AdminClient<rdkafka::client::DefaultClientContext>>()
        {
            let _ = admin.delete_topics(&[topic], &AdminOptions::new()).await;
        }
    }

    /// The group's lag on `topic`: records past its committed offsets, over `partitions`.
    pub fn lag(&self, group: &str, topic: &str, partitions: i32) -> Result<u64, String> {
        use rdkafka::consumer::Consumer;
        let consumer = self.client(group)?;
        let mut list = rdkafka::TopicPartitionList::new();
        for partition in 0..partitions {
            list.add_partition(topic, partition);
        }
        let committed = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .map_err(|e| format!("the committed offsets of {group}: {e}"))?;
        let mut lag = 0;
        for (partition, (_, high)) in (0..partitions).zip(watermarks(&consumer, topic, partitions)?)
        {
            let at = match committed
                .find_partition(topic, partition)
                .map(|element| element.offset())
            {
                Some(rdkafka::Offset::Offset(offset)) => offset,
                _ => 0,
            };
            lag += u64::try_from(high - at).unwrap_or(0);
        }
        Ok(lag)
    }

    /// Records `topic` holds over `partitions`: the sum of their end offsets less their
    /// starts (nothing is deleted in a run).
    pub fn records(&self, topic: &str, partitions: i32) -> Result<u64, String> {
        let consumer = self.client(&format!("{topic}-reader"))?;
        Ok(watermarks(&consumer, topic, partitions)?
            .into_iter()
            .map(|(low, high)| u64::try_from(high - low).unwrap_or(0))
            .sum())
    }

    /// A client of the brokers, in `group` (which it never joins).
    fn client(&self, group: &str) -> Result<rdkafka::consumer::BaseConsumer, String> {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .create()
            .map_err(|e| format!("a Kafka client for {}: {e}", self.bootstrap))
    }
}

/// The low and high watermarks of `topic`'s partitions `0..partitions`.
fn watermarks(
    consumer: &rdkafka::consumer::BaseConsumer,
    topic: &str,
    partitions: i32,
) -> Result<Vec<(i64, i64)>, String> {
    use rdkafka::consumer::Consumer;
    (0..partitions)
        .map(|partition| {
            consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .map_err(|e| format!("the offsets of {topic}/{partition}: {e}"))
        })
        .collect()
}

impl Drop for Kafka {
    fn drop(&mut self) {
        if let Some((child, _)) = &mut self.tansu {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The SQS endpoint of a run: `SQS_ENDPOINT` (an SQS-compatible server; the credentials
/// and region come from the usual `AWS_*` variables, else test ones), or a private moto
/// server (`MOTO`, else `moto_server` on the PATH) on a free port, killed when this is
/// dropped.
pub struct Sqs {
    /// The endpoint the clients connect to.
    pub endpoint: String,
    moto: Option<std::process::Child>,
}

impl Sqs {
    /// `SQS_ENDPOINT` if set, else a private moto server, started and answering.
    pub async fn start() -> Result<Self, String> {
        if let Ok(endpoint) = std::env::var("SQS_ENDPOINT")
            && !endpoint.is_empty()
        {
            return Ok(Self {
                endpoint,
                moto: None,
            });
        }
        let program = std::env::var("MOTO").unwrap_or_else(|_| "moto_server".to_owned());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("a free port for moto: {e}"))?
            .port();
        let child = std::process::Command::new(&program)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "set SQS_ENDPOINT to an SQS-compatible server, or MOTO to moto's moto_server \
                     to start a private one (`{program}` did not start: {e})"
                )
            })?;
        let sqs = Self {
            endpoint: format!("http://127.0.0.1:{port}"),
            moto: Some(child),
        };
        let client = sqs.client();
        for _ in 0..300 {
            if client.list_queues().send().await.is_ok() {
                return Ok(sqs);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(format!(
            "moto did not answer at {} within 30 s",
            sqs.endpoint
        ))
    }

    /// What [`Sqs::start`] connected to, for the run's header.
    pub fn describe(&self) -> String {
        match self.moto {
            Some(_) => format!("moto at {} (private)", self.endpoint),
            None => format!("SQS at {} (SQS_ENDPOINT)", self.endpoint),
        }
    }

    /// A client of the endpoint: the region and credentials of the environment where set,
    /// else `us-east-1` and test credentials.
    pub fn client(&self) -> aws_sdk_sqs::Client {
        sqs_client(&self.endpoint)
    }

    /// Creates `name` with visibility timeout `visibility` and a dead-letter queue
    /// `<name>-dead` after `max_receive_count` receives; the queue's URL.
    pub async fn create_queue(
        &self,
        name: &str,
        visibility: Duration,
        max_receive_count: u32,
    ) -> Result<String, String> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let client = self.client();
        let failed =
            |what: &str, e: &dyn std::fmt::Display| format!("{what} at {}: {e}", self.endpoint);
        let dead = client
            .create_queue()
            .queue_name(format!("{name}-dead"))
            .send()
            .await
            .map_err(|e| failed("create the dead-letter queue", &e))?
            .queue_url
            .unwrap_or_default();
        let arn = client
            .get_queue_attributes()
            .queue_url(&dead)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .map_err(|e| failed("read the dead-letter queue", &e))?
            .attributes
            .and_then(|mut attributes| attributes.remove(&QueueAttributeName::QueueArn))
            .unwrap_or_default();
        client
            .create_queue()
            .queue_name(name)
            .attributes(
                QueueAttributeName::VisibilityTimeout,
                visibility.as_secs().to_string(),
            )
            .attributes(
                QueueAttributeName::RedrivePolicy,
                format!(
                    r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive_count}"}}"#
                ),
            )
            .send()
            .await
            .map_err(|e| failed("create the queue", &e))
            .map(|output| output.queue_url.unwrap_or_default())
    }

    /// Deletes the queue `url` and its dead-letter queue.
    pub async fn delete_queue(&self, url: &str) {
        let client = self.client();
        for url in [url.to_owned(), format!("{url}-dead")] {
            let _ = client.delete_queue().queue_url(url).send().await;
        }
    }

    /// Messages in the queue: visible, delayed and in flight.
    pub async fn pending(&self, url: &str) -> Result<u64, String> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let attributes = self
            .client()
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .map_err(|e| format!("read the queue {url}: {e}"))?
            .attributes
            .unwrap_or_default();
        Ok([
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
            QueueAttributeName::ApproximateNumberOfMessagesDelayed,
        ]
        .iter()
        .filter_map(|name| attributes.get(name)?.parse::<u64>().ok())
        .sum())
    }
}

/// A client of the SQS endpoint `endpoint`: the region and credentials of the environment
/// (`AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) where set, else `us-east-1`
/// and test credentials, as a local server takes them.
pub fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".to_owned());
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "test".to_owned());
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "test".to_owned());
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new(key, secret, None, None, "environment"))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

impl Drop for Sqs {
    fn drop(&mut self) {
        if let Some(child) = &mut self.moto {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
