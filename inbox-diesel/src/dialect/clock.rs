//! The test kit's clock on each backend: `UPDATE` statements that make time pass for the
//! markers of a table ([`testing::end_leases`](crate::testing::end_leases) and
//! [`testing::pass_time`](crate::testing::pass_time)).

use std::time::Duration;

use inbox_core::InboxSchema;

use crate::dialect::Backend;

/// Every open claim's lease, ended a second ago.
pub(crate) fn end_leases(backend: Backend, schema: &InboxSchema) -> String {
    let past = match backend {
        Backend::Postgres => "CURRENT_TIMESTAMP - INTERVAL '1 second'",
        Backend::Mysql => "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
        Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 seconds')",
    };
    format!(
        "UPDATE {} SET claimed_until = {past} \
         WHERE processed_at IS NULL AND claimed_until IS NOT NULL",
        backend.quote_table(schema.table())
    )
}

/// Every marker's times, `by` earlier.
pub(crate) fn pass_time(backend: Backend, schema: &InboxSchema, by: Duration) -> String {
    let micros = by.as_micros();
    let earlier = |column: &str, precise: bool| match backend {
        Backend::Postgres => {
            format!("{column} = {column} - {micros} * INTERVAL '1 microsecond'")
        }
        Backend::Mysql => format!("{column} = {column} - INTERVAL {micros} MICROSECOND"),
        // Each column as the runtime writes it: seconds (`CURRENT_TIMESTAMP`), or
        // milliseconds for a lease.
        Backend::Sqlite => {
            let seconds = format!(
                "'-{}.{:06} seconds'",
                micros / 1_000_000,
                micros % 1_000_000
            );
            match precise {
                true => {
                    format!("{column} = strftime('%Y-%m-%d %H:%M:%f', {column}, {seconds})")
                }
                false => format!("{column} = datetime({column}, {seconds})"),
            }
        }
    };
    format!(
        "UPDATE {} SET {}, {}, {}",
        backend.quote_table(schema.table()),
        earlier("received_at", false),
        earlier("processed_at", false),
        earlier("claimed_until", true),
    )
}
