//! Parameters that are patterns, axum extractor style included (local look-alike types).
use dlock_runtime::{LockError, dlock};

pub struct Path<T>(pub T);
pub struct State<T>(pub T);
pub struct Json<T>(pub T);

#[derive(Clone)]
pub struct App {
    pub name: String,
}

pub struct CreateOrder {
    pub sku: String,
    pub qty: u32,
    pub note: Option<String>,
}

pub struct Point {
    x: i32,
    y: i32,
}

#[dlock(key = "order:<id>:<sku>:<app.name>")]
async fn handler(
    Path(id): Path<u64>,
    State(app): State<App>,
    Json(CreateOrder { sku, qty, .. }): Json<CreateOrder>,
) -> Result<String, LockError> {
    Ok(format!("{id} {} {sku} {qty}", app.name))
}

#[dlock(key = "tuple:<a>:<b>:<c>")]
async fn tuples((a, (b, _)): (u8, (u16, u32)), &c: &u64, mut d: u8) -> Result<u8, LockError> {
    d += a;
    let _ = (b, c);
    Ok(d)
}

#[dlock(key = "point:<px>:<y>")]
async fn structs(Point { x: px, y }: Point, [first, .., last]: [u8; 3]) -> Result<i32, LockError> {
    Ok(px + y + i32::from(first) + i32::from(last))
}

#[dlock(key = "ref:<value>:<whole.0>")]
async fn bindings(
    ref value: String,
    whole @ Path(_): Path<u32>,
    _: u8,
) -> Result<usize, LockError> {
    let _ = whole;
    Ok(value.len())
}

#[dlock(key = "mut:<items>")]
async fn mutable(mut items: String) -> Result<String, LockError> {
    items.push('!');
    Ok(items)
}

fn main() {
    drop(handler(
        Path(1),
        State(App { name: "a".into() }),
        Json(CreateOrder {
            sku: "s".into(),
            qty: 1,
            note: None,
        }),
    ));
    drop(tuples((1, (2, 3)), &4, 5));
    drop(structs(Point { x: 1, y: 2 }, [1, 2, 3]));
    drop(bindings("v".into(), Path(1), 0));
    drop(mutable(String::new()));
}
