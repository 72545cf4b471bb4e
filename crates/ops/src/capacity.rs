//! A counting limit whose size changes while its places are held:
//! connections, search threads, persistent searches.

use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

pub struct Capacity {
    places: Arc<Semaphore>,
    /// The size configured last.
    size: Mutex<usize>,
}

impl Capacity {
    pub fn new(size: usize) -> Arc<Capacity> {
        Arc::new(Capacity {
            places: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
        })
    }

    /// The places (a permit is one place).
    pub fn places(&self) -> &Arc<Semaphore> {
        &self.places
    }

    pub fn size(&self) -> usize {
        *self.size.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Places held now (an estimate while a shrink waits for holders).
    pub fn in_use(&self) -> usize {
        self.size().saturating_sub(self.places.available_permits())
    }

    /// Change the size: a larger one applies at once; a smaller one as
    /// holders give places back (a task takes the difference as it frees
    /// up and keeps it). Holders are never taken a place from. Needs a
    /// tokio runtime when shrinking.
    pub fn resize(&self, size: usize) {
        let mut current = self.size.lock().unwrap_or_else(|p| p.into_inner());
        if size > *current {
            self.places.add_permits(size - *current);
        } else if size < *current {
            let places = self.places.clone();
            let take = u32::try_from(*current - size).unwrap_or(u32::MAX);
            tokio::spawn(async move {
                if let Ok(p) = places.acquire_many_owned(take).await {
                    p.forget();
                }
            });
        }
        *current = size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grows_at_once_and_shrinks_as_places_are_given_back() {
        let c = Capacity::new(2);
        let a = c.places().clone().try_acquire_owned().unwrap();
        let b = c.places().clone().try_acquire_owned().unwrap();
        assert!(c.places().clone().try_acquire_owned().is_err());
        c.resize(3);
        let third = c.places().clone().try_acquire_owned().unwrap();
        assert_eq!(c.in_use(), 3);
        // Down to one: the three held keep theirs; freed places go.
        c.resize(1);
        drop((a, b));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(c.places().clone().try_acquire_owned().is_err());
        drop(third);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let one = c.places().clone().try_acquire_owned().unwrap();
        assert!(c.places().clone().try_acquire_owned().is_err());
        drop(one);
        assert_eq!((c.size(), c.in_use()), (1, 0));
    }
}
