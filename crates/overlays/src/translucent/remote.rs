//! The remote server of a translucent suffix: searches and reads as the
//! service account over a pool of at most `max_connections` connections
//! (kept between searches; a search finding every one in use waits its
//! turn), binds passed through on a connection of their own. What the remote sends is checked: entries
//! outside the searched scope and DNs that do not parse end the answer
//! with an error naming the remote; more entries than allowed, or more
//! than [`MAX_BYTES`] of values, end it early. A whole search takes at
//! most [`WHOLE_SEARCH`] timeouts, and stops when its client abandons it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::{
    BindAuth, BindRequest, DerefAliases, Filter, LdapResult, ProtocolOp, ResultCode, Scope,
    SearchRequest,
};

use pando_client::{Client, ClientError, Endpoint};

/// Most bytes of attribute values one search holds from the remote.
pub const MAX_BYTES: usize = 256 << 20;

/// A whole remote search may take this many of the endpoint's timeouts
/// (each message waited for is bounded by one).
pub const WHOLE_SEARCH: u32 = 4;

/// Attributes of remote entries not shown: counts of children the
/// requester may not be allowed to see.
const DROPPED: &[&str] = &["hasSubordinates", "numSubordinates"];

/// How a remote search failed: the connection (worth one more try on a
/// fresh one, when it was a kept one), or the remote's answer.
enum Failure {
    Transport(ClientError),
    Answer(ClientError),
}

pub struct Remote {
    pub endpoint: Endpoint,
    max_pdu: usize,
    /// Connections bound as the service account, not in use.
    idle: Mutex<Vec<Client>>,
    /// One place per connection in use (`max_connections`). A connection
    /// is made only when none is idle, so the idle ones and those in use
    /// are never more than the places: the remote sees at most that many
    /// of this server's connections (binds passed through aside).
    places: Arc<Semaphore>,
}

/// A connection in use, with its place in the pool.
struct Lease {
    client: Client,
    /// Kept from an earlier search (it may have been closed since).
    kept: bool,
    _place: OwnedSemaphorePermit,
}

/// A remote search's answer.
#[derive(Default)]
pub struct Found {
    /// Entries with their normalised DNs, in the order sent.
    pub entries: Vec<(String, Entry)>,
    /// The remote has no entry at the search base.
    pub no_such_object: bool,
    /// The remote stopped before the end (its size or time limit, or
    /// ours): why.
    pub cut: Option<String>,
    /// The base entry, when a search read only it to learn that it exists.
    pub probed_base: Option<Entry>,
}

impl Remote {
    pub fn new(endpoint: Endpoint, max_pdu: usize, max_connections: usize) -> Remote {
        Remote {
            endpoint,
            max_pdu,
            idle: Mutex::new(Vec::new()),
            places: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }

    /// A place in the pool (waiting at most one timeout while all are in
    /// use), then a kept connection or a new one.
    async fn take(&self) -> Result<Lease, ClientError> {
        let wait = Duration::from_secs(self.endpoint.timeout_secs);
        let place = match tokio::time::timeout(wait, self.places.clone().acquire_owned()).await {
            Ok(Ok(p)) => p,
            _ => {
                return Err(ClientError(format!(
                    "every connection to {} stayed in use for {}s (the translucent overlay's max_connections)",
                    self.endpoint.url,
                    wait.as_secs()
                )))
            }
        };
        if let Some(client) = self.idle.lock().ok().and_then(|mut v| v.pop()) {
            return Ok(Lease {
                client,
                kept: true,
                _place: place,
            });
        }
        Ok(Lease {
            client: self.fresh().await?,
            kept: false,
            _place: place,
        })
    }

    /// A new connection bound as the service account.
    async fn fresh(&self) -> Result<Client, ClientError> {
        let mut c = Client::connect(&self.endpoint, self.max_pdu).await?;
        c.bind(&self.endpoint).await?;
        Ok(c)
    }

    /// Keep the lease's connection for the next search; its place is
    /// given back when the lease drops, after it is idle.
    fn give_back(&self, lease: Lease) {
        if let Ok(mut v) = self.idle.lock() {
            v.push(lease.client);
        }
    }

    /// Search the remote. A kept connection that
    /// fails (the remote may have closed it while idle) is replaced once.
    /// `abandoned`: the client's search was abandoned (the remote's answer
    /// is then not read to its end).
    pub async fn search(
        &self,
        schema: &Schema,
        q: &Query<'_>,
        abandoned: &AtomicBool,
    ) -> Result<Found, ClientError> {
        let mut lease = self.take().await?;
        let mut answer = self
            .search_within(&mut lease.client, schema, q, abandoned)
            .await;
        if lease.kept && matches!(answer, Err(Failure::Transport(_))) {
            lease.client = self.fresh().await?;
            answer = self
                .search_within(&mut lease.client, schema, q, abandoned)
                .await;
        }
        match answer {
            Ok((found, read_to_end)) => {
                if read_to_end {
                    self.give_back(lease);
                }
                Ok(found)
            }
            Err(Failure::Transport(e) | Failure::Answer(e)) => Err(e),
        }
    }

    /// [`search_on`] within [`WHOLE_SEARCH`] timeouts; true with the
    /// answer when it was read to its end (the connection can be kept).
    async fn search_within(
        &self,
        client: &mut Client,
        schema: &Schema,
        q: &Query<'_>,
        abandoned: &AtomicBool,
    ) -> Result<(Found, bool), Failure> {
        let whole = Duration::from_secs(self.endpoint.timeout_secs) * WHOLE_SEARCH;
        match tokio::time::timeout(whole, search_on(client, schema, q, abandoned)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Answer(ClientError(format!(
                "{} did not finish a search of {} within {}s",
                self.endpoint.url,
                q.base,
                whole.as_secs()
            )))),
        }
    }

    /// The remote entry named `dn`, if there is one.
    pub async fn read(&self, schema: &Schema, dn: &str) -> Result<Option<Entry>, ClientError> {
        let all = Filter::Present("objectClass".into());
        let attrs = ["*".to_string(), "+".to_string()];
        let q = Query {
            base: dn,
            scope: Scope::Base,
            filter: &all,
            attrs: &attrs,
            max: 1,
        };
        let found = self.search(schema, &q, &AtomicBool::new(false)).await?;
        Ok(found.entries.into_iter().next().map(|(_, e)| e))
    }

    /// A simple bind as `dn` with `password`, on a connection of its own
    /// (the kept ones stay the service account's): the remote's result.
    pub async fn bind_as(&self, dn: &str, password: Vec<u8>) -> Result<LdapResult, ClientError> {
        let mut c = Client::connect(&self.endpoint, self.max_pdu).await?;
        let id = c
            .send(
                ProtocolOp::BindRequest(BindRequest {
                    version: 3,
                    name: dn.to_string(),
                    auth: BindAuth::Simple(password),
                }),
                Vec::new(),
            )
            .await?;
        let wait = Some(Duration::from_secs(self.endpoint.timeout_secs));
        let m = c.recv(wait).await?;
        c.unbind().await;
        match m.op {
            ProtocolOp::BindResponse(r) if m.id == id => Ok(r.result),
            other => Err(ClientError(format!(
                "{} answered a bind with {:?}",
                self.endpoint.url,
                other.tag()
            ))),
        }
    }
}

/// What one remote search asks for: at most `max` entries.
#[derive(Clone, Copy)]
pub struct Query<'a> {
    pub base: &'a str,
    pub scope: Scope,
    pub filter: &'a Filter,
    pub attrs: &'a [String],
    pub max: u64,
}

/// One search on `client`; true with the answer when it was read to its
/// SearchResultDone (else the connection is left mid-answer: not kept).
async fn search_on(
    client: &mut Client,
    schema: &Schema,
    q: &Query<'_>,
    abandoned: &AtomicBool,
) -> Result<(Found, bool), Failure> {
    let Query {
        base,
        scope,
        filter,
        attrs,
        max,
    } = *q;
    let answer = |e: String| Failure::Answer(ClientError(e));
    let timeout = client.timeout();
    let req = SearchRequest {
        base: base.to_string(),
        scope,
        deref: DerefAliases::Never,
        size_limit: i32::try_from(max).unwrap_or(i32::MAX),
        time_limit: i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX),
        types_only: false,
        filter: filter.clone(),
        attrs: attrs.to_vec(),
    };
    let base_norm = Dn::parse(base)
        .ok()
        .and_then(|d| schema.normalize_dn(&d).ok())
        .ok_or_else(|| answer(format!("'{base}' is not a DN")))?;
    let id = client
        .send(ProtocolOp::SearchRequest(req), Vec::new())
        .await
        .map_err(Failure::Transport)?;
    let mut found = Found::default();
    let mut bytes = 0usize;
    loop {
        let m = client
            .recv(Some(timeout))
            .await
            .map_err(Failure::Transport)?;
        if m.id != id {
            return Err(answer(format!(
                "{} answered message {} to search {id}",
                client.url, m.id
            )));
        }
        if abandoned.load(Ordering::Relaxed) {
            // The rest is not read (the connection is not kept).
            found.cut = Some("abandoned".into());
            return Ok((found, false));
        }
        match m.op {
            ProtocolOp::SearchResultEntry(e) => {
                bytes += e
                    .attrs
                    .iter()
                    .flat_map(|a| &a.values)
                    .map(Vec::len)
                    .sum::<usize>();
                if found.entries.len() as u64 >= max || bytes > MAX_BYTES {
                    // More than allowed: the rest is not read (the
                    // connection is not kept).
                    found.cut = Some(if bytes > MAX_BYTES {
                        format!("more than {} MiB of values", MAX_BYTES >> 20)
                    } else {
                        format!("more than {max} entries")
                    });
                    return Ok((found, false));
                }
                let (norm, entry) =
                    decode_entry(schema, &client.url, e).map_err(Failure::Answer)?;
                if !pando_ops::norm_dn::in_scope(&base_norm, scope, &norm) {
                    return Err(answer(format!(
                        "{} sent {} for a search of {base}, outside its scope",
                        client.url, entry.dn
                    )));
                }
                found.entries.push((norm, entry));
            }
            ProtocolOp::SearchResultReference(_) => {}
            ProtocolOp::SearchResultDone(r) => {
                ended(&client.url, base, &r, &mut found).map_err(answer)?;
                return Ok((found, true));
            }
            other => {
                return Err(answer(format!(
                    "{} answered a search with {:?}",
                    client.url,
                    other.tag()
                )))
            }
        }
    }
}

/// What a remote search's SearchResultDone says: nothing more (success),
/// no such base, or cut short by one of its limits (noted in `found`);
/// any other result is an error, the message saying so.
fn ended(url: &str, base: &str, r: &LdapResult, found: &mut Found) -> Result<(), String> {
    match r.code {
        ResultCode::SUCCESS => {}
        ResultCode::NO_SUCH_OBJECT => found.no_such_object = true,
        ResultCode::SIZE_LIMIT_EXCEEDED
        | ResultCode::TIME_LIMIT_EXCEEDED
        | ResultCode::ADMIN_LIMIT_EXCEEDED => {
            found.cut = Some(format!(
                "it answered {} ({}) {}",
                r.code.0,
                r.code.name(),
                r.message
            ))
        }
        c => {
            return Err(format!(
                "{url} answered a search of {base} with {} ({}) {}",
                c.0,
                c.name(),
                r.message
            ))
        }
    }
    Ok(())
}

/// A remote entry as this server holds entries: attribute descriptions
/// spelled as the schema spells them (types it does not know are kept as
/// sent and not returned to clients), with its normalised DN.
fn decode_entry(
    schema: &Schema,
    url: &str,
    e: pando_proto::SearchResultEntry,
) -> Result<(String, Entry), ClientError> {
    let bad = |why: String| ClientError(format!("{url} sent an entry named '{}': {why}", e.dn));
    let dn = Dn::parse(&e.dn).map_err(|x| bad(x.to_string()))?;
    let norm = schema.normalize_dn(&dn).map_err(bad)?;
    let attrs = e
        .attrs
        .into_iter()
        .filter(|a| !DROPPED.iter().any(|d| d.eq_ignore_ascii_case(&a.name)))
        .map(|a| {
            let desc = match schema.canonical_desc(&a.name) {
                Ok((d, _)) => d.into_owned(),
                Err(_) => a.name,
            };
            Attribute {
                desc,
                values: a.values,
            }
        })
        .collect();
    Ok((norm, Entry { dn, attrs }))
}
