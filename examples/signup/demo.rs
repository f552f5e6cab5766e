// The sign-up handlers and scenarios, written once over `Conn`: each backend's module in
// `main.rs` names its connection `Conn` (`type Conn = SqliteConnection;`, `PgConnection`,
// `MysqlConnection`) and includes this file.

/// `REQUESTS` threads, each with its own connection, start `request` together.
fn race<T: Send>(
    connect: &(dyn Fn() -> Conn + Sync),
    request: &(dyn Fn(&mut Conn, &Barrier) -> Result<T, String> + Sync),
) -> Vec<Result<T, String>> {
    let (start, gap) = (Barrier::new(REQUESTS), Barrier::new(REQUESTS));
    let results = Mutex::new(Vec::new());
    // Connected first: a thread that failed before the barrier would hold the others.
    let conns: Vec<Conn> = (0..REQUESTS).map(|_| connect()).collect();
    std::thread::scope(|scope| {
        for mut conn in conns {
            let (start, gap, results) = (&start, &gap, &results);
            scope.spawn(move || {
                start.wait();
                let result = request(&mut conn, gap);
                results.lock().unwrap().push(result);
            });
        }
    });
    results.into_inner().unwrap()
}

fn find(conn: &mut Conn, email: &str) -> QueryResult<Option<i64>> {
    users::table
        .filter(users::email.eq(email))
        .select(users::id)
        .first(conn)
        .optional()
}

fn insert(conn: &mut Conn, email: &str) -> QueryResult<i64> {
    diesel::insert_into(users::table)
        .values(users::email.eq(email))
        .execute(conn)?;
    find(conn, email)?.ok_or(diesel::result::Error::NotFound)
}

/// The first attempt: check, then insert.
fn naive(conn: &mut Conn, gap: &Barrier, email: &str) -> QueryResult<i64> {
    // Every request reaches the gap, even one whose check failed.
    let existing = find(conn, email);
    gap.wait();
    match existing? {
        Some(id) => Ok(id),
        None => insert(conn, email),
    }
}

/// A tenant, then its settings: only the first request may create them.
fn create_tenant(conn: &mut Conn, gap: Option<&Barrier>) -> QueryResult<i64> {
    let existing: QueryResult<Option<i64>> = tenants::table
        .filter(tenants::name.eq("acme"))
        .select(tenants::id)
        .first(conn)
        .optional();
    if let Some(gap) = gap {
        gap.wait();
    }
    if let Some(id) = existing? {
        return Ok(id);
    }
    diesel::insert_into(tenants::table)
        .values(tenants::name.eq("acme"))
        .execute(conn)?;
    let id = tenants::table
        .filter(tenants::name.eq("acme"))
        .select(diesel::dsl::max(tenants::id))
        .first::<Option<i64>>(conn)?
        .ok_or(diesel::result::Error::NotFound)?;
    diesel::insert_into(tenant_settings::table)
        .values((
            tenant_settings::tenant.eq(id),
            tenant_settings::plan.eq("free"),
        ))
        .execute(conn)?;
    Ok(id)
}

fn tally(scenario: &'static str, results: Vec<Result<i64, String>>, rows: i64) -> Row {
    let mut ids: Vec<i64> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    Row {
        scenario,
        ok: REQUESTS - errors.len(),
        errors,
        rows,
        ids: ids.len(),
    }
}

pub fn run_demo(connect: &(dyn Fn() -> Conn + Sync)) -> Vec<Row> {
    let mut rows = Vec::new();
    let users_with = |email: &str| -> i64 {
        users::table
            .filter(users::email.eq(email))
            .count()
            .get_result(&mut connect())
            .expect("count users")
    };
    let scenarios: [(&'static str, &'static str); 5] = [
        ("check, then insert", "naive@example.com"),
        (
            "check, then insert, in a transaction",
            "naive-tx@example.com",
        ),
        ("unique::insert_or_get", "get@example.com"),
        ("unique::upsert", "upsert@example.com"),
        ("unique::insert_if_absent", "absent@example.com"),
    ];
    for (n, (scenario, email)) in scenarios.into_iter().enumerate() {
        let results = race(connect, &|conn, gap| {
            let fail = |e: UniqueError| e.to_string();
            match n {
                0 => naive(conn, gap, email).map_err(|e| e.to_string()),
                1 => conn
                    .transaction(|c| naive(c, gap, email))
                    .map_err(|e| e.to_string()),
                2 => unique::insert_or_get(
                    conn,
                    &USERS_EMAIL,
                    |c| insert(c, email),
                    |c| find(c, email)?.ok_or(diesel::result::Error::NotFound),
                )
                .map(|created| created.into_inner())
                .map_err(fail),
                3 => unique::upsert(
                    conn,
                    &USERS_EMAIL,
                    diesel::insert_into(users::table).values(users::email.eq(email)),
                    users::id,
                )
                .map_err(fail),
                _ => unique::insert_if_absent(
                    conn,
                    &USERS_EMAIL,
                    diesel::insert_into(users::table).values(users::email.eq(email)),
                )
                .map(i64::from)
                .map_err(fail),
            }
        });
        rows.push(tally(scenario, results, users_with(email)));
    }

    let tenant_rows = || -> i64 {
        tenants::table
            .count()
            .get_result(&mut connect())
            .expect("count tenants")
    };
    let results = race(connect, &|conn, gap| {
        conn.transaction(|c| create_tenant(c, Some(gap)))
            .map_err(|e| e.to_string())
    });
    rows.push(tally(
        "tenant + settings, in a transaction",
        results,
        tenant_rows(),
    ));
    connect()
        .batch_execute("DELETE FROM tenant_settings; DELETE FROM tenants")
        .expect("clear the tenants");
    let results = race(connect, &|conn, _| {
        unique::serialize_on(conn, "tenant:acme", |c| {
            create_tenant(c, None).map_err(UniqueError::from)
        })
        .map_err(|e| e.to_string())
    });
    rows.push(tally("unique::serialize_on", results, tenant_rows()));
    rows
}
