//! The agent's heap, and how it gives memory back.
//!
//! A build on the host uses glibc's allocator, which keeps a heap ("arena") per thread that
//! allocates, up to eight per core: the watch decodes objects on tokio's workers, the controller
//! keeps them, and each arena stays as large as its busiest moment. One arena holds the agent's
//! resident size to what it uses; the agent's few threads allocate mostly from their per-thread
//! caches, so they seldom wait on its lock.
//!
//! The image's static (musl) binary uses jemalloc instead of musl's own heap, with the same one
//! arena and dirty pages handed back after five seconds: at Kubernetes' limits it starts faster,
//! stays smaller and spends less CPU in an update storm than musl's heap (`cargo bench --bench
//! control_plane -- limits` with `TOPOLOGY_AGENT` set to the static binary). Handing pages back
//! sooner cost CPU at steady state for no smaller resident size; mimalloc kept far more. An
//! operator can still tune it: `_RJEM_MALLOC_CONF` is read at start, over the settings below.
//!
//! One thread allocates apart ([`own_arena`]): the full sync's writer, which allocates as much as
//! the controller while it decides; a host build held to one glibc arena cannot give it one, and
//! its full sync decides, then writes.

/// jemalloc for the static binary (see the module's documentation).
#[cfg(target_env = "musl")]
#[global_allocator]
static HEAP: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once at its start: one arena, dirty pages purged after five seconds
/// and not kept as "muzzy" (lazily freed) pages, which still count as resident until the kernel
/// needs them.
#[cfg(target_env = "musl")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static JEMALLOC_CONF: Settings = Settings(c"narenas:1,dirty_decay_ms:5000,muzzy_decay_ms:0".as_ptr());

/// A C string jemalloc reads as `const char *malloc_conf`.
#[cfg(target_env = "musl")]
#[repr(transparent)]
struct Settings(*const std::ffi::c_char);

// SAFETY: the pointer is to a static, immutable C string.
#[cfg(target_env = "musl")]
unsafe impl Sync for Settings {}

/// Set once glibc is held to one arena (by [`limit_arenas`] or `MALLOC_ARENA_MAX=1`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
static ONE_ARENA: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Limits glibc to one arena, unless the operator chose (`MALLOC_ARENA_MAX`), and keeps jemalloc's
/// settings in the static binary. Call before any thread starts.
pub fn limit_arenas() {
    // jemalloc reads its settings through a weak symbol, which alone would not link them in.
    #[cfg(target_env = "musl")]
    std::hint::black_box(&JEMALLOC_CONF);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    match std::env::var_os("MALLOC_ARENA_MAX") {
        None => {
            // SAFETY: mallopt only sets a tunable of the allocator; no other thread runs yet.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, 1);
            }
            ONE_ARENA.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Some(max) => ONE_ARENA.store(max == "1", std::sync::atomic::Ordering::Relaxed),
    }
}

/// Gives the calling thread a heap apart from the other threads', for a thread that allocates as
/// much as the controller at the same time (the full sync's writer): two threads on one arena
/// wait on its locks, and deciding beside the writer takes about twice as long. jemalloc (the image): an arena of its own, created the first time and kept for the
/// next caller. glibc: a new thread gets its own arena unless held to one ([`limit_arenas`]),
/// which no call can undo. Returns whether the thread now allocates apart.
pub fn own_arena() -> bool {
    #[cfg(target_env = "musl")]
    {
        jemalloc_arena::bind()
    }
    #[cfg(not(target_env = "musl"))]
    {
        arenas_apart()
    }
}

/// Whether [`own_arena`] can give a thread a heap apart, without doing it.
pub fn arenas_apart() -> bool {
    #[cfg(target_env = "musl")]
    {
        true
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        !ONE_ARENA.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(any(target_env = "musl", all(target_os = "linux", target_env = "gnu"))))]
    {
        false
    }
}

/// jemalloc's explicit arenas: `arenas.create` once, `thread.arena` per thread.
#[cfg(target_env = "musl")]
mod jemalloc_arena {
    use std::{ffi::c_void, sync::OnceLock};

    /// The arena made for threads that allocate apart; `None` if jemalloc refused to make one.
    static APART: OnceLock<Option<u32>> = OnceLock::new();

    pub(super) fn bind() -> bool {
        let arena = APART.get_or_init(|| {
            let (mut index, mut len) = (0u32, std::mem::size_of::<u32>());
            // SAFETY: "arenas.create" writes the new arena's index, a u32, to `index`.
            let created = unsafe {
                tikv_jemalloc_sys::mallctl(
                    c"arenas.create".as_ptr(),
                    (&raw mut index).cast::<c_void>(),
                    &raw mut len,
                    std::ptr::null_mut(),
                    0,
                )
            };
            (created == 0).then_some(index)
        });
        let Some(mut index) = *arena else { return false };
        // SAFETY: "thread.arena" reads a u32 arena index, one that exists, for the calling thread.
        let bound = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"thread.arena".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut index).cast::<c_void>(),
                std::mem::size_of::<u32>(),
            )
        };
        bound == 0
    }
}

/// Hands the heap a full sync freed (list pages, queued events, the previous plan) back to the
/// system: glibc keeps freed memory below its heap's top otherwise, and the agent's resident size
/// would stay at the sync's peak for good.
pub fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}
