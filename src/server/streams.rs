//! HTTP/2 streams served inside their connection's task. hyper hands each new stream to an
//! executor; spawned as a task of its own, a stream paid for a task's cell, copies of its
//! future into it and a trip through the scheduler for every wake-up. One connection's
//! streams are now served by one thread at a time, as nginx's and Envoy's workers serve
//! theirs: many connections still spread over the runtime's threads.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::AtomicWaker;

type Stream = Pin<Box<dyn Future<Output = ()> + Send>>;

thread_local! {
    /// Whether this thread is polling a connection through [`Streams::drive`] right now.
    static DRIVING: Cell<bool> = const { Cell::new(false) };
    /// Streams hyper started during that poll, for the connection to take.
    static STARTED: RefCell<Vec<Stream>> = const { RefCell::new(Vec::new()) };
}

/// hyper's executor for HTTP/2 streams: a stream started while [`Streams::drive`] polls a
/// connection joins that connection's streams; any other is spawned as a task.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StreamExecutor;

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        if DRIVING.get() {
            STARTED.with_borrow_mut(|started| started.push(Box::pin(stream)));
        } else {
            tokio::spawn(stream);
        }
    }
}

/// One connection's streams, and the connection's result once it has ended.
pub(crate) struct Streams<T> {
    running: FuturesUnordered<Stream>,
    ended: Option<T>,
    /// Wakes the task for the connection and notes that it, not a stream, is to be polled:
    /// a stream's upstream answer then does not cost a poll of the whole connection.
    connection_wake: Arc<ConnectionWake>,
    connection_waker: Waker,
}

struct ConnectionWake {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for ConnectionWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<T> Streams<T> {
    pub(crate) fn new() -> Streams<T> {
        let connection_wake = Arc::new(ConnectionWake {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Streams {
            running: FuturesUnordered::new(),
            ended: None,
            connection_waker: Waker::from(connection_wake.clone()),
            connection_wake,
        }
    }

    /// To be called after `connection` was changed outside [`Streams::drive`] (told to shut
    /// down gracefully): nothing wakes it for that, and the next drive polls it all the same.
    pub(crate) fn changed(&self) {
        self.connection_wake.woken.store(true, Ordering::Release);
    }

    /// Polls `connection` (when it was woken, until it has ended) and the streams it
    /// started; ready with the connection's result once the connection has ended and its
    /// streams have finished. Cancel-safe: the result is kept here until then.
    pub(crate) fn drive<C>(&mut self, cx: &mut Context<'_>, connection: Pin<&mut C>) -> Poll<T>
    where
        C: Future<Output = T>,
    {
        self.connection_wake.task.register(cx.waker());
        if self.ended.is_none() && self.connection_wake.woken.swap(false, Ordering::AcqRel) {
            let outer = DRIVING.replace(true);
            let polled = connection.poll(&mut Context::from_waker(&self.connection_waker));
            DRIVING.set(outer);
            STARTED.with_borrow_mut(|started| self.running.extend(started.drain(..)));
            if let Poll::Ready(result) = polled {
                self.ended = Some(result);
            }
        }
        while let Poll::Ready(Some(())) = self.running.poll_next_unpin(cx) {}
        match self.ended.take() {
            Some(result) if self.running.is_empty() => Poll::Ready(result),
            ended => {
                self.ended = ended;
                Poll::Pending
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;
    use std::sync::atomic::AtomicUsize;
    use tokio::sync::Semaphore;

    /// A connection that starts one stream per poll, `left` in all, then ends. Each stream
    /// waits for a permit of `gate`, then counts itself in `finished`.
    struct Starting {
        left: usize,
        polls: usize,
        gate: Arc<Semaphore>,
        finished: Arc<AtomicUsize>,
    }

    impl Starting {
        fn new(left: usize, permits: usize) -> Starting {
            Starting {
                left,
                polls: 0,
                gate: Arc::new(Semaphore::new(permits)),
                finished: Arc::new(AtomicUsize::new(0)),
            }
        }
    }

    impl Future for Starting {
        type Output = &'static str;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<&'static str> {
            self.polls += 1;
            if self.left == 0 {
                return Poll::Ready("ended");
            }
            self.left -= 1;
            let (gate, finished) = (self.gate.clone(), self.finished.clone());
            StreamExecutor.execute(async move {
                gate.acquire().await.expect("open").forget();
                finished.fetch_add(1, Ordering::Relaxed);
            });
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_connection_ends_after_the_streams_it_started() {
        let mut connection = std::pin::pin!(Starting::new(3, 3));
        let mut streams = Streams::new();
        let result = std::future::poll_fn(|cx| streams.drive(cx, connection.as_mut())).await;
        assert_eq!(result, "ended");
        assert_eq!(connection.finished.load(Ordering::Relaxed), 3);
        assert!(STARTED.with_borrow(Vec::is_empty));
    }

    #[tokio::test]
    async fn a_stream_started_outside_a_connection_is_spawned() {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        StreamExecutor.execute(async move {
            let _ = sender.send(());
        });
        receiver.await.expect("the spawned stream ran");
        assert!(STARTED.with_borrow(Vec::is_empty));
    }

    #[tokio::test]
    async fn an_ended_connection_waits_for_its_streams_and_is_not_polled_again() {
        let mut connection = std::pin::pin!(Starting::new(1, 0));
        let mut streams = Streams::new();
        // Each drive dropped after one poll, as a `select!` drops its other branches: the
        // stream starts, then the connection ends while the stream waits for the gate.
        for _ in 0..3 {
            let polled =
                std::future::poll_fn(|cx| Poll::Ready(streams.drive(cx, connection.as_mut())))
                    .await;
            assert!(polled.is_pending(), "the stream has not finished");
        }
        assert_eq!(
            connection.polls, 2,
            "an ended connection is not polled again"
        );
        connection.gate.add_permits(1);
        let result = std::future::poll_fn(|cx| streams.drive(cx, connection.as_mut())).await;
        assert_eq!(result, "ended");
        assert_eq!(connection.finished.load(Ordering::Relaxed), 1);
    }

    /// A connection that never wakes its task, counting its polls.
    struct Silent(usize);

    impl Future for Silent {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            self.0 += 1;
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_connection_is_polled_when_woken_or_changed_only() {
        let mut connection = std::pin::pin!(Silent(0));
        let mut streams = Streams::new();
        let mut drives = 0;
        for change in [false, false, true] {
            if change {
                streams.changed();
            }
            let polled =
                std::future::poll_fn(|cx| Poll::Ready(streams.drive(cx, connection.as_mut())))
                    .await;
            assert!(polled.is_pending());
            drives += 1;
            if drives == 2 {
                assert_eq!(connection.0, 1, "polled first, then not again unwoken");
            }
        }
        assert_eq!(
            connection.0, 2,
            "polled after a change such as a graceful shutdown"
        );
    }
}
