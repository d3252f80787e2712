//! Fair mode's grants: a release that finds a fair waiter's place first in the key's queue makes
//! the key that waiter's (see `WAKE_LINE`), and the waiter takes it up without a statement of
//! its own; the take-up (`ADOPT`) follows in the background, and the hold counts as lost if it
//! has not answered before the grant's short lease runs out.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::time::Instant;

use crate::lease::valid_until;

/// What this process's places claimed, and the grants heard for them, per key as stored.
pub(super) struct Claims {
    keys: Mutex<HashMap<String, Entry>>,
    /// Claims whose waiters left (their place left the queue) within their lease, per key: a
    /// grant heard for one is handed back (a release that raced the leaving could grant it).
    departed: Mutex<HashMap<String, Vec<(String, Instant)>>>,
    /// Releases a hold of `(key, token)` in the background: a grant handed back.
    hand_back: HandBack,
    /// Take-ups in flight, per key: every request on that key waits for its answer (a release
    /// sent before it would find the hold as granted, not yet taken up).
    taking_up: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// How many take-ups are in flight: a request reads this, not the map, when there is none.
    in_flight: AtomicUsize,
}

/// See [`Claims::new`].
type HandBack = Box<dyn Fn(String, String) + Send + Sync>;

/// The claim a place wrote last, and a grant for it once heard.
struct Entry {
    /// The waiter whose token the claim is.
    token: String,
    /// When the request that wrote the claim was sent: the server grants the claim's lease from
    /// a release after it, so the client counts that lease from here.
    sent_at: Instant,
    /// The claim's lease, ms.
    ms: u64,
    /// The fence of the hold a release granted, once its notification came.
    granted: Option<u64>,
    /// Whether the claim's time is known: not after a request that may have written it failed
    /// (a grant for it is then not taken up, but still handed back once its place left).
    timed: bool,
}

/// A grant for a waiter, to take up: the hold's fence, and by when the take-up must have
/// answered (the grant's lease on the client's clock).
pub(super) struct Granted {
    pub(super) fence: u64,
    pub(super) valid_until: Instant,
}

impl Claims {
    /// No claims yet; a grant handed back is released by `hand_back(key, token)`.
    pub(super) fn new(hand_back: impl Fn(String, String) + Send + Sync + 'static) -> Self {
        Self {
            keys: Mutex::default(),
            departed: Mutex::default(),
            hand_back: Box::new(hand_back),
            taking_up: Mutex::default(),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn departed(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(String, Instant)>>> {
        self.departed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn taking_up(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.taking_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A request that writes `token`'s claim for `key` is sent now; a grant heard before it was
    /// for an earlier claim.
    pub(super) fn claimed(&self, key: &str, token: &str, ms: u64) {
        self.keys().insert(
            key.to_owned(),
            Entry {
                token: token.to_owned(),
                sent_at: Instant::now(),
                ms,
                granted: None,
                timed: true,
            },
        );
    }

    /// The place of `key` holds no claim of this process any more: its waiter took the key.
    pub(super) fn forget(&self, key: &str) {
        let mut keys = self.keys();
        if !keys.is_empty() {
            keys.remove(key);
        }
    }

    /// The request that wrote `key`'s claim failed: whether and when it was written is unknown,
    /// so a grant for it is not taken up (the waiter's next attempt takes it over), but is still
    /// handed back if the place leaves, counted as written now.
    pub(super) fn unsure(&self, key: &str) {
        if let Some(entry) = self.keys().get_mut(key) {
            entry.timed = false;
            entry.sent_at = Instant::now();
        }
    }

    /// The place of `key` left the queue: a grant heard for its claim from now on is handed
    /// back (until the claim's lease has passed).
    pub(super) fn left(&self, key: &str) {
        let Some(entry) = self.keys().remove(key) else {
            return;
        };
        let until = entry.sent_at + Duration::from_millis(entry.ms);
        let now = Instant::now();
        let mut departed = self.departed();
        departed.retain(|_, claims| {
            claims.retain(|(_, until)| *until > now);
            !claims.is_empty()
        });
        departed
            .entry(key.to_owned())
            .or_default()
            .push((entry.token, until));
    }

    /// A release granted `key` to the claim whose token ends with `claim`, with this fence (from
    /// the notification): recorded for its waiter, or handed back when that waiter left; a grant
    /// for a claim this process no longer knows is left to lapse (its place's next attempt takes
    /// it over).
    pub(super) fn heard(&self, key: &str, claim: &str, fence: u64) {
        if let Some(entry) = self.keys().get_mut(key)
            && entry.token.ends_with(claim)
        {
            entry.granted = Some(fence);
            return;
        }
        let handed_back = {
            let mut departed = self.departed();
            let Some(claims) = departed.get_mut(key) else {
                return;
            };
            // Kept until its lease has passed: a release that the hand-back overtook may grant
            // it again (a release is safe to repeat).
            claims
                .iter()
                .find(|(token, _)| token.ends_with(claim))
                .map(|(token, _)| token.clone())
        };
        if let Some(token) = handed_back {
            (self.hand_back)(key.to_owned(), token);
        }
    }

    /// The grant heard for `token`'s claim on `key`, when more than `margin` of its lease is left
    /// to take it up in; the claim is gone either way once a grant was heard (a grant for another
    /// waiter's claim is taken over by this waiter's attempt, one too late by its own).
    pub(super) fn granted_to(&self, key: &str, token: &str, margin: Duration) -> Option<Granted> {
        let mut keys = self.keys();
        keys.get(key)?.granted?;
        let entry = keys.remove(key)?;
        let valid_until = valid_until(entry.sent_at, Duration::from_millis(entry.ms));
        let in_time = entry.timed && Instant::now() + margin < valid_until;
        (entry.token == token && in_time).then(|| Granted {
            fence: entry.granted.unwrap_or(0),
            valid_until,
        })
    }

    /// A take-up of `key` begins: requests on that key wait until the returned gate is dropped
    /// (when the take-up has answered, or its task ended otherwise).
    pub(super) async fn taking_up_begins(self: &Arc<Self>, key: &str) -> TakingUp {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        // A new mutex: free at once.
        let held = gate.clone().lock_owned().await;
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.taking_up().insert(key.to_owned(), gate.clone());
        TakingUp {
            claims: self.clone(),
            key: key.to_owned(),
            gate,
            _held: held,
        }
    }

    /// Waits for a take-up of `key` in flight to answer.
    pub(super) async fn settled(&self, key: &str) {
        if self.in_flight.load(Ordering::Acquire) == 0 {
            return;
        }
        let gate = self.taking_up().get(key).cloned();
        if let Some(gate) = gate {
            drop(gate.lock().await);
        }
    }
}

/// A take-up in flight (see [`Claims::taking_up_begins`]): dropped, it lets the key's requests
/// go on.
pub(super) struct TakingUp {
    claims: Arc<Claims>,
    key: String,
    gate: Arc<tokio::sync::Mutex<()>>,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for TakingUp {
    fn drop(&mut self) {
        let mut taking_up = self.claims.taking_up();
        if taking_up
            .get(&self.key)
            .is_some_and(|gate| Arc::ptr_eq(gate, &self.gate))
        {
            taking_up.remove(&self.key);
        }
        drop(taking_up);
        self.claims.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A grant's payload, `+<place><claim><fence>:<key>`: the place's 8 hex digits, the last 8 of
/// the claim's token, the fence and the key; `None` for any other payload.
pub(super) fn parse(payload: &str) -> Option<(&str, &str, u64, &str)> {
    let rest = payload.strip_prefix('+')?;
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let (place, claim) = (
        rest.get(..8).filter(|p| hex(p))?,
        rest.get(8..16).filter(|c| hex(c))?,
    );
    let (fence, key) = rest[16..].split_once(':')?;
    Some((place, claim, fence.parse().ok()?, key))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn a_grant_payload_names_place_claim_fence_and_key() {
        assert_eq!(
            parse("+0a1b2c3dffffeeee42:order:+7:x"),
            Some(("0a1b2c3d", "ffffeeee", 42, "order:+7:x"))
        );
        assert_eq!(
            parse("+0a1b2c3dffffeeee42:"),
            Some(("0a1b2c3d", "ffffeeee", 42, ""))
        );
        assert_eq!(parse("0a1b2c3d+42:k"), None);
        assert_eq!(parse("+0a1b2c3dffffeeeex:k"), None);
        assert_eq!(parse("+0a1b2c3dffffeee:42:k"), None);
        assert_eq!(parse("+0a1b2c3d"), None);
        assert_eq!(parse("--------k"), None);
    }

    /// The grants handed back: key and token.
    type Handed = Arc<Mutex<Vec<(String, String)>>>;

    fn claims() -> (Claims, Handed) {
        let handed = Arc::new(Mutex::new(Vec::new()));
        let record = handed.clone();
        let claims = Claims::new(move |key, token| record.lock().unwrap().push((key, token)));
        (claims, handed)
    }

    const MARGIN: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn a_grant_is_taken_up_only_by_the_claims_waiter_and_only_once() {
        let (claims, handed) = claims();
        claims.heard("k", "0000000a", 7);
        assert!(
            claims.granted_to("k", "a", MARGIN).is_none(),
            "no claim: no grant"
        );
        claims.claimed("k", "0000000a", 10_000);
        assert!(
            claims.granted_to("k", "0000000a", MARGIN).is_none(),
            "not heard yet"
        );
        claims.heard("k", "0000000b", 7);
        assert!(
            claims.granted_to("k", "0000000a", MARGIN).is_none(),
            "a grant for another claim"
        );
        claims.heard("k", "0000000a", 7);
        let granted = claims.granted_to("k", "0000000a", MARGIN);
        assert_eq!(granted.map(|g| g.fence), Some(7));
        assert!(
            claims.granted_to("k", "0000000a", MARGIN).is_none(),
            "taken up once"
        );
        claims.claimed("k", "0000000a", 10_000);
        claims.heard("k", "0000000a", 8);
        assert!(
            claims.granted_to("k", "0000000b", MARGIN).is_none(),
            "another waiter"
        );
        claims.heard("k", "0000000a", 8);
        assert!(
            claims.granted_to("k", "0000000a", MARGIN).is_none(),
            "the claim went"
        );
        claims.claimed("k", "0000000a", 50);
        claims.heard("k", "0000000a", 9);
        assert!(
            claims.granted_to("k", "0000000a", MARGIN).is_none(),
            "too little of the lease left"
        );
        assert!(handed.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_grant_heard_for_a_claim_whose_place_left_is_handed_back() {
        let (claims, handed) = claims();
        claims.claimed("k", "0000000a", 10_000);
        claims.left("k");
        claims.claimed("k", "0000000b", 10_000);
        claims.heard("k", "0000000a", 7);
        claims.heard("k", "0000000a", 8);
        claims.heard("k", "0000000c", 9);
        let back = ("k".to_owned(), "0000000a".to_owned());
        assert_eq!(*handed.lock().unwrap(), [back.clone(), back]);
        assert!(claims.granted_to("k", "0000000b", MARGIN).is_none());
    }

    #[tokio::test]
    async fn a_claim_whose_request_failed_is_handed_back_but_not_taken_up() {
        let (claims, handed) = claims();
        claims.claimed("k", "0000000a", 10_000);
        claims.unsure("k");
        claims.heard("k", "0000000a", 7);
        assert!(claims.granted_to("k", "0000000a", MARGIN).is_none());
        claims.claimed("k", "0000000a", 10_000);
        claims.unsure("k");
        claims.left("k");
        claims.heard("k", "0000000a", 8);
        assert_eq!(handed.lock().unwrap().len(), 1);
    }
}
