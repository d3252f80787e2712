//! Parameters that are patterns, against a real `redis-server`: axum-like newtype extractors
//! (`Path(id)`, `State(app)`, `Json(CreateOrder { sku, .. })`) with `client = &app.locks` taken
//! from an argument, tuples, tuple structs, structs with `..`, `&` patterns, `ref`, `@` and
//! `mut` bindings. Names bound inside patterns fill the key; the key exists while the body runs.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use dlock_runtime::{LockError, Locker, dlock};
use dlock_tests::{RedisServer, racy_increment};

struct Path<T>(T);
struct State<T>(T);
struct Json<T>(T);

#[derive(Clone)]
struct App {
    name: &'static str,
    locks: Locker,
    server: Arc<RedisServer>,
    sold: Arc<AtomicU64>,
}

impl App {
    fn new(server: &Arc<RedisServer>) -> Self {
        Self {
            name: "shop",
            locks: server.locker(),
            server: server.clone(),
            sold: Arc::default(),
        }
    }
}

struct CreateOrder {
    sku: String,
    qty: u32,
    note: Option<String>,
}

fn order(sku: &str, qty: u32) -> Json<CreateOrder> {
    Json(CreateOrder {
        sku: sku.to_owned(),
        qty,
        note: None,
    })
}

#[dlock(key = "order:<app.name>:<id>:<sku>", client = &app.locks)]
async fn handler(
    State(app): State<App>,
    Path(id): Path<u64>,
    Json(CreateOrder { sku, qty, .. }): Json<CreateOrder>,
) -> Result<(bool, String), LockError> {
    let held = app.server.exists(&format!("dlock:order:shop:{id}:{sku}"));
    racy_increment(&app.sold).await;
    Ok((held, format!("{id} {sku} x{qty}")))
}

#[tokio::test]
async fn axum_like_extractors_and_client_from_an_argument() {
    let server = Arc::new(RedisServer::start());
    let (held, body) = handler(State(App::new(&server)), Path(9), order("tea", 2))
        .await
        .unwrap();
    assert!(held);
    assert_eq!(body, "9 tea x2");
    assert!(!server.exists("dlock:order:shop:9:tea"));
}

/// Eight handlers, each with its own `App` (own connection), on the same order: every
/// increment of the shared counter survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_handlers_exclude_each_other() {
    let server = Arc::new(RedisServer::start());
    let sold = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let app = App {
                sold: sold.clone(),
                ..App::new(&server)
            };
            tokio::spawn(handler(State(app), Path(1), order("tea", 1)))
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().unwrap().0);
    }
    assert_eq!(sold.load(Ordering::SeqCst), 8);
    assert!(!server.exists("dlock:order:shop:1:tea"));
}

#[dlock(key = "tuple:<a>:<b>:<c>:<d>", client = locker)]
async fn tuples(
    (locker, server): (&Locker, &RedisServer),
    (a, (b, _)): (u8, (u16, u32)),
    &c: &u64,
    mut d: u8,
) -> Result<(bool, u8), LockError> {
    // `d` is the argument's value in the key; the body's change comes after.
    d += a;
    let _ = (b, c);
    Ok((server.exists("dlock:tuple:1:2:4:5"), d))
}

struct Point {
    x: i32,
    y: i32,
}

#[dlock(key = "point:<px>:<y>:<first>:<last>", client = locker)]
async fn structs(
    locker: &Locker,
    server: &RedisServer,
    Point { x: px, y }: Point,
    [first, .., last]: [u8; 3],
) -> Result<(bool, i32), LockError> {
    let held = server.exists("dlock:point:-1:2:7:9");
    Ok((held, px + y + i32::from(first) + i32::from(last)))
}

#[allow(
    clippy::toplevel_ref_arg,
    reason = "a `ref` parameter is the shape under test"
)]
#[dlock(key = "ref:<value>:<whole.0>:<note>", client = locker)]
async fn bindings(
    locker: &Locker,
    server: &RedisServer,
    ref value: String,
    whole @ Path(_): Path<u32>,
    Json(
        CreateOrder {
            note: Some(note), ..
        }
        | CreateOrder { sku: note, .. },
    ): Json<CreateOrder>,
    _: u8,
) -> Result<(bool, usize), LockError> {
    let _ = whole;
    let held = server.exists(&format!("dlock:ref:{value}:3:{note}"));
    Ok((held, value.len()))
}

#[dlock(key = "mut:<items>", client = locker)]
async fn mutable(
    locker: &Locker,
    server: &RedisServer,
    mut items: String,
) -> Result<(bool, String), LockError> {
    items.push('!');
    Ok((server.exists("dlock:mut:abc"), items))
}

#[tokio::test]
async fn tuple_reference_and_mut_patterns() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(
        tuples((&locker, &server), (1, (2, 3)), &4, 5)
            .await
            .unwrap(),
        (true, 6)
    );
    assert!(!server.exists("dlock:tuple:1:2:4:5"));
    assert_eq!(
        mutable(&locker, &server, "abc".to_owned()).await.unwrap(),
        (true, "abc!".to_owned())
    );
    assert!(!server.exists("dlock:mut:abc"));
}

#[tokio::test]
async fn struct_slice_ref_at_and_or_patterns() {
    let server = RedisServer::start();
    let locker = server.locker();
    assert_eq!(
        structs(&locker, &server, Point { x: -1, y: 2 }, [7, 8, 9])
            .await
            .unwrap(),
        (true, 17)
    );
    assert!(!server.exists("dlock:point:-1:2:7:9"));
    let noted = Json(CreateOrder {
        sku: "tea".to_owned(),
        qty: 1,
        note: Some("gift".to_owned()),
    });
    assert_eq!(
        bindings(&locker, &server, "v".to_owned(), Path(3), noted, 0)
            .await
            .unwrap(),
        (true, 1)
    );
    assert!(!server.exists("dlock:ref:v:3:gift"));
    assert!(
        bindings(
            &locker,
            &server,
            "v".to_owned(),
            Path(3),
            order("tea", 1),
            0
        )
        .await
        .unwrap()
        .0
    );
    assert!(!server.exists("dlock:ref:v:3:tea"));
}
