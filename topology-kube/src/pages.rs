//! A full list read page by page, each page decoded off the runtime while the next is fetched.
//!
//! kube-rs's `Api::list` fetches a page and decodes it on the task that asked, so a kind's list
//! is one thread's work and the next page is not asked for until the last is decoded. Here the
//! page's text is decoded on a blocking thread, which hands the list's metadata (and with it the
//! continue token) back as soon as it has read it — the API server writes it before the items —
//! so the next page is on its way while the items are decoded, and two pages of one kind decode
//! at once. Pages come out in the order the server sent them.

use std::{collections::VecDeque, fmt, marker::PhantomData};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::{Client, api::ListParams};
use serde::{
    Deserialize, Deserializer,
    de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor},
};
use tokio::{sync::oneshot, task::JoinHandle};

/// Pages of one list decoding at once (and so in memory as objects, beside one being fetched).
const DECODING: usize = 2;

/// One decoded page, in what the caller made of its objects.
pub struct Page<T> {
    /// The items, each made into a `T`.
    pub items: Vec<T>,
    /// Whether it is the list's last page.
    pub last: bool,
    /// The list started over with this page (a continue token expired): the pages before it
    /// are void, and this one holds every object.
    pub restarted: bool,
}

/// The pages of one list, in order; see the module's documentation.
pub struct Pages<K, T, E> {
    client: Client,
    url: String,
    params: Option<ListParams>,
    /// Pages being decoded, oldest first.
    decoding: VecDeque<JoinHandle<Result<Vec<T>, serde_json::Error>>>,
    /// The resourceVersion of the page fetched last.
    version: String,
    /// The parameters of the first page, to start over with.
    first: ListParams,
    /// Ask for `PartialObjectMetadata`.
    metadata_only: bool,
    /// The list started over since the last page was handed out.
    restarted: bool,
    each: E,
    kind: PhantomData<fn(K) -> T>,
}

impl<K, T, E> Pages<K, T, E>
where
    K: DeserializeOwned + Send + 'static,
    T: Send + 'static,
    E: Fn(K) -> T + Clone + Send + 'static,
{
    /// A list of `url` (a resource's path) with `params`, each item made into a `T` by `each` on
    /// the decoding thread; `metadata_only`: of the objects' metadata (`PartialObjectMetadata`).
    pub fn new(client: Client, url: &str, params: ListParams, metadata_only: bool, each: E) -> Self {
        Self {
            metadata_only,
            client,
            url: url.to_owned(),
            first: params.clone(),
            restarted: false,
            params: Some(params),
            decoding: VecDeque::new(),
            version: String::new(),
            each,
            kind: PhantomData,
        }
    }

    /// The next page, `None` after the last. An error ends the list.
    pub async fn next(&mut self) -> Result<Option<Page<T>>, PageError> {
        while self.decoding.len() < DECODING
            && let Some(params) = self.params.take()
        {
            self.fetch(params).await?;
        }
        let Some(oldest) = self.decoding.pop_front() else { return Ok(None) };
        let items = oldest.await.map_err(PageError::Decoder)?.map_err(PageError::Decode)?;
        // The page after this one was asked for before this one was waited on, if there is one.
        let last = self.decoding.is_empty() && self.params.is_none();
        Ok(Some(Page { items, last, restarted: std::mem::take(&mut self.restarted) }))
    }

    /// The list's resourceVersion (as of its last page, once that was read).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Fetches one page, starts decoding it, and takes from it what the next page needs.
    async fn fetch(&mut self, mut params: ListParams) -> Result<(), PageError> {
        let text = loop {
            let request = kube::core::Request::new(&self.url);
            let built = if self.metadata_only { request.list_metadata(&params) } else { request.list(&params) };
            let mut request = built.map_err(kube::Error::BuildRequest)?;
            request.extensions_mut().insert("list");
            match self.client.request_text(request).await {
                Ok(text) => break text,
                Err(kube::Error::Api(status)) if status.code == 410 && params.continue_token.is_some() => {
                    params = self.start_over();
                }
                Err(error) => return Err(error.into()),
            }
        };
        let (head, metadata) = oneshot::channel();
        let each = self.each.clone();
        self.decoding.push_back(tokio::task::spawn_blocking(move || decode(&text, head, each)));
        // A page that cannot be decoded up to its metadata ends the list here; its error is the
        // decoding's, taken when it is waited on.
        let Ok(metadata) = metadata.await else { return Ok(()) };
        self.version = metadata.resource_version.unwrap_or_default();
        self.params = metadata.continue_.filter(|token| !token.is_empty()).map(|token| params.continue_token(&token));
        Ok(())
    }

    /// The snapshot the pages were read from is compacted away (its continue token expired, as
    /// it does after five minutes or so): the list starts over as one request without a limit,
    /// as client-go's pager does — paging again could expire again on a list that takes longer
    /// than the compaction interval. The parameters of that request.
    fn start_over(&mut self) -> ListParams {
        tracing::info!(url = %self.url, "a list's continue token expired; listing again in one request");
        for pending in self.decoding.drain(..) {
            pending.abort();
        }
        self.restarted = true;
        let mut whole = self.first.clone();
        whole.limit = None;
        whole
    }
}

/// A list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    /// The API refused or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// A page was not a list of the kind.
    #[error("decoding a list page: {0}")]
    Decode(#[source] serde_json::Error),
    /// The thread decoding a page failed (panicked, or the runtime is shutting down).
    #[error("decoding a list page: {0}")]
    Decoder(#[source] tokio::task::JoinError),
}

/// Decodes a page's text, sending its metadata to `head` as soon as it is read, and makes each
/// item a `T`.
fn decode<K: DeserializeOwned, T>(
    text: &str,
    head: oneshot::Sender<ListMeta>,
    each: impl Fn(K) -> T,
) -> Result<Vec<T>, serde_json::Error> {
    let mut parser = serde_json::Deserializer::from_str(text);
    let seed = ListSeed { head: Some(head), each, kind: PhantomData };
    let items = serde::de::DeserializeSeed::deserialize(seed, &mut parser)?;
    parser.end()?;
    Ok(items)
}

/// Reads a list object: `metadata` sent on at once, `items` made into `T`s, the rest skipped.
struct ListSeed<K, E> {
    head: Option<oneshot::Sender<ListMeta>>,
    each: E,
    kind: PhantomData<fn(K)>,
}

impl<'de, K: DeserializeOwned, T, E: Fn(K) -> T> serde::de::DeserializeSeed<'de> for ListSeed<K, E> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, K: DeserializeOwned, T, E: Fn(K) -> T> Visitor<'de> for ListSeed<K, E> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a list object")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Metadata => {
                    let metadata: ListMeta = map.next_value()?;
                    if let Some(head) = self.head.take() {
                        // The fetching side may have gone (the list was abandoned).
                        let _ = head.send(metadata);
                    }
                }
                Field::Items => items = map.next_value_seed(Items { each: &self.each, kind: PhantomData })?,
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if let Some(head) = self.head.take() {
            let _ = head.send(ListMeta::default());
        }
        Ok(items)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Metadata,
    Items,
    #[serde(other)]
    Other,
}

/// `items`: each decoded and made a `T` at once, so no page of `K`s is ever held whole.
struct Items<'a, K, E> {
    each: &'a E,
    kind: PhantomData<fn(K)>,
}

impl<'de, K: DeserializeOwned, T, E: Fn(K) -> T> serde::de::DeserializeSeed<'de> for Items<'_, K, E> {
    type Value = Vec<T>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, K: DeserializeOwned, T, E: Fn(K) -> T> Visitor<'de> for Items<'_, K, E> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a list of objects")
    }

    fn visit_none<Failed>(self) -> Result<Self::Value, Failed> {
        Ok(Vec::new())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<K>()? {
            items.push((self.each)(item));
        }
        Ok(items)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Item {
        name: String,
    }

    fn names(text: &str) -> (Result<Vec<String>, serde_json::Error>, Option<ListMeta>) {
        let (head, mut metadata) = oneshot::channel();
        let decoded = decode(text, head, |item: Item| item.name);
        (decoded, metadata.try_recv().ok())
    }

    #[test]
    fn the_metadata_is_handed_over_before_any_item_is_made() {
        let text = r#"{"kind":"ServiceList","apiVersion":"v1",
            "metadata":{"resourceVersion":"7","continue":"ns~b"},
            "items":[{"name":"a","spec":{}},{"name":"b"}]}"#;
        let (head, metadata) = oneshot::channel();
        let metadata = Mutex::new(metadata);
        let made = decode(text, head, |item: Item| {
            let head = metadata.lock().unwrap().try_recv().ok();
            (item.name, head.map(|head| head.continue_))
        });
        assert_eq!(
            made.unwrap(),
            [("a".to_owned(), Some(Some("ns~b".to_owned()))), ("b".to_owned(), None)],
            "the first item is made once its page's continue token is on its way"
        );
    }

    #[test]
    fn items_come_in_order_wherever_the_metadata_is() {
        let (items, head) = names(r#"{"items":[{"name":"a"},{"name":"b"}],"metadata":{"resourceVersion":"9"}}"#);
        assert_eq!(items.unwrap(), ["a", "b"]);
        assert_eq!(head.unwrap().resource_version.as_deref(), Some("9"));
        let (items, head) = names(r#"{"items":null}"#);
        assert_eq!(items.unwrap(), Vec::<String>::new());
        assert_eq!(head, Some(ListMeta::default()), "a list without metadata has no next page");
    }

    #[test]
    fn a_page_that_is_not_a_list_is_an_error_naming_where() {
        let (items, head) = names(r#"{"metadata":{},"items":[{"name":"a"},{"nam":"b"}]}"#);
        let error = items.unwrap_err().to_string();
        assert!(error.contains("missing field `name`") && error.contains("line 1"), "{error}");
        assert!(head.is_some(), "the metadata went before the bad item");
        let (items, head) = names(r#"[1, 2]"#);
        assert!(items.unwrap_err().to_string().contains("a list object"));
        assert!(head.is_none(), "no metadata: the fetching side learns of the failure");
        let (items, _) = names(r#"{"items":[]} trailing"#);
        assert!(items.unwrap_err().to_string().contains("trailing characters"));
    }
}
