//! The command line.

use crate::run::Broker;

pub(crate) struct Options {
    pub(crate) messages: usize,
    pub(crate) rounds: usize,
    pub(crate) prefetch: Vec<u16>,
    pub(crate) in_flight: u16,
    pub(crate) connections: Option<u32>,
    only: Option<Broker>,
    pub(crate) no_database: bool,
}

impl Options {
    pub(crate) fn parse() -> Result<Self, String> {
        let mut options = Self {
            messages: 10_000,
            rounds: 3,
            prefetch: vec![1, 4, 16, 64, 256],
            in_flight: 1000,
            connections: None,
            only: None,
            no_database: false,
        };
        let mut arguments = std::env::args().skip(1);
        while let Some(flag) = arguments.next() {
            let mut value = || {
                arguments
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let bad = |e: std::num::ParseIntError| format!("{flag}: {e}");
            match flag.as_str() {
                "--messages" => options.messages = value()?.parse().map_err(bad)?,
                "--rounds" => options.rounds = value()?.parse().map_err(bad)?,
                "--prefetch" => {
                    // `--prefetch none`: the memory measurement alone.
                    options.prefetch = match value()?.as_str() {
                        "none" => Vec::new(),
                        list => list
                            .split(',')
                            .map(|n| n.trim().parse().map_err(bad))
                            .collect::<Result<_, _>>()?,
                    };
                }
                "--in-flight" => options.in_flight = value()?.parse().map_err(bad)?,
                "--connections" => options.connections = Some(value()?.parse().map_err(bad)?),
                "--no-database" => options.no_database = true,
                "--only" => {
                    options.only = Some(match value()?.as_str() {
                        "rabbitmq" => Broker::RabbitMq,
                        "nats" => Broker::Nats,
                        "kafka" => Broker::Kafka,
                        "sqs" => Broker::Sqs,
                        other => {
                            return Err(format!("--only {other}: rabbitmq, nats, kafka or sqs"));
                        }
                    });
                }
                other => {
                    return Err(format!(
                        "unknown argument {other}; usage: broker_bench [--messages N] \
                         [--rounds R] [--prefetch 1,4,16,64,256|none] [--in-flight K (0: no memory \
                         measurement)] [--connections C] [--only rabbitmq|nats|kafka|sqs] [--no-database]"
                    ));
                }
            }
        }
        if options.messages == 0 || options.rounds == 0 || options.prefetch.contains(&0) {
            return Err("--messages, --rounds and every --prefetch must be at least 1".into());
        }
        Ok(options)
    }

    pub(crate) fn brokers(&self) -> Vec<Broker> {
        match self.only {
            Some(broker) => vec![broker],
            None => vec![Broker::RabbitMq, Broker::Nats, Broker::Kafka, Broker::Sqs],
        }
    }
}
