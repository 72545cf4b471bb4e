//! The remote server of a translucent suffix: searches and reads as the
//! service account over a few kept connections, binds passed through on a
//! connection of their own. What the remote sends is checked: entries
//! outside the searched scope, DNs that do not parse and more entries than
//! allowed end the answer with an error naming the remote.

use std::sync::Mutex;
use std::time::Duration;

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::{
    BindAuth, BindRequest, DerefAliases, Filter, LdapResult, ProtocolOp, ResultCode, Scope,
    SearchRequest,
};

use crate::net::client::{Client, ClientError, Endpoint};

/// Idle connections kept for the next search.
const KEPT: usize = 4;

pub struct Remote {
    pub endpoint: Endpoint,
    max_pdu: usize,
    idle: Mutex<Vec<Client>>,
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
}

impl Remote {
    pub fn new(endpoint: Endpoint, max_pdu: usize) -> Remote {
        Remote {
            endpoint,
            max_pdu,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A kept connection, or a new one bound as the service account.
    async fn take(&self) -> Result<(Client, bool), ClientError> {
        if let Some(c) = self.idle.lock().ok().and_then(|mut v| v.pop()) {
            return Ok((c, true));
        }
        let mut c = Client::connect(&self.endpoint, self.max_pdu).await?;
        c.bind(&self.endpoint).await?;
        Ok((c, false))
    }

    fn give_back(&self, c: Client) {
        if let Ok(mut v) = self.idle.lock() {
            if v.len() < KEPT {
                v.push(c);
            }
        }
    }

    /// Search the remote; at most `max` entries. A kept connection that
    /// fails (the remote may have closed it while idle) is replaced once.
    pub async fn search(
        &self,
        schema: &Schema,
        base: &str,
        scope: Scope,
        filter: &Filter,
        max: u64,
    ) -> Result<Found, ClientError> {
        let (mut client, kept) = self.take().await?;
        let mut answer = search_on(&mut client, schema, base, scope, filter, max).await;
        if kept && answer.is_err() {
            let (mut fresh, _) = self.take_fresh().await?;
            answer = search_on(&mut fresh, schema, base, scope, filter, max).await;
            client = fresh;
        }
        match answer {
            Ok(found) => {
                if found.cut.is_none() {
                    self.give_back(client);
                }
                Ok(found)
            }
            Err(e) => Err(e),
        }
    }

    async fn take_fresh(&self) -> Result<(Client, bool), ClientError> {
        let mut c = Client::connect(&self.endpoint, self.max_pdu).await?;
        c.bind(&self.endpoint).await?;
        Ok((c, false))
    }

    /// The remote entry named `dn`, if there is one.
    pub async fn read(&self, schema: &Schema, dn: &str) -> Result<Option<Entry>, ClientError> {
        let all = Filter::Present("objectClass".into());
        let found = self.search(schema, dn, Scope::Base, &all, 1).await?;
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

/// One search on `client`.
async fn search_on(
    client: &mut Client,
    schema: &Schema,
    base: &str,
    scope: Scope,
    filter: &Filter,
    max: u64,
) -> Result<Found, ClientError> {
    let timeout = client.timeout();
    let req = SearchRequest {
        base: base.to_string(),
        scope,
        deref: DerefAliases::Never,
        size_limit: i32::try_from(max).unwrap_or(i32::MAX),
        time_limit: i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX),
        types_only: false,
        filter: filter.clone(),
        attrs: vec!["*".into(), "+".into()],
    };
    let base_norm = Dn::parse(base)
        .ok()
        .and_then(|d| schema.normalize_dn(&d).ok())
        .ok_or_else(|| ClientError(format!("'{base}' is not a DN")))?;
    let id = client
        .send(ProtocolOp::SearchRequest(req), Vec::new())
        .await?;
    let mut found = Found::default();
    loop {
        let m = client.recv(Some(timeout)).await?;
        if m.id != id {
            return Err(ClientError(format!(
                "{} answered message {} to search {id}",
                client.url, m.id
            )));
        }
        match m.op {
            ProtocolOp::SearchResultEntry(e) => {
                if found.entries.len() as u64 >= max {
                    // More than asked for: the rest is not read (the
                    // connection is not kept).
                    found.cut = Some(format!("more than {max} entries"));
                    return Ok(found);
                }
                let (norm, entry) = decode_entry(schema, &client.url, e)?;
                if !crate::ops::norm_dn::in_scope(&base_norm, scope, &norm) {
                    return Err(ClientError(format!(
                        "{} sent {} for a search of {base}, outside its scope",
                        client.url, entry.dn
                    )));
                }
                found.entries.push((norm, entry));
            }
            ProtocolOp::SearchResultReference(_) => {}
            ProtocolOp::SearchResultDone(r) => {
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
                        return Err(ClientError(format!(
                            "{} answered a search of {base} with {} ({}) {}",
                            client.url,
                            c.0,
                            c.name(),
                            r.message
                        )))
                    }
                }
                return Ok(found);
            }
            other => {
                return Err(ClientError(format!(
                    "{} answered a search with {:?}",
                    client.url,
                    other.tag()
                )))
            }
        }
    }
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
        .map(|a| {
            let desc = match schema.canonical_desc(&a.name) {
                Ok((d, _)) => d,
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
