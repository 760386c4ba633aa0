//! `get -w` without the network: which rows to print for a sequence of watch events.
//!
//! Like `kubectl get -w`, the first full list is printed as a table, then a row each
//! time an object's row changes. Unlike kubectl, an update that changes nothing
//! visible (a new resourceVersion, a metrics tick) prints nothing, and AGE alone never
//! counts as a change.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::cli::OutputFormat;
use crate::error::CliError;
use crate::format::{column_widths, table_line};
use crate::resources::{Listed, RowCells, View, header_row, qualified_name, row, row_cells};

/// Namespace ("" when cluster-scoped) and name.
type Key = (String, String);

fn key<K: Listed>(object: &K) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// What a watch has seen and printed so far.
#[derive(Debug)]
pub struct WatchState<K> {
    view: View,
    objects: BTreeMap<Key, K>,
    printed: HashMap<Key, RowCells>,
    /// Objects of a (re)list in progress, between `Init` and `InitDone`.
    relisting: Option<BTreeMap<Key, K>>,
    synced: bool,
}

impl<K: Listed> WatchState<K> {
    /// An empty watch laid out as `view`.
    pub fn new(view: View) -> Self {
        Self {
            view,
            objects: BTreeMap::new(),
            printed: HashMap::new(),
            relisting: None,
            synced: false,
        }
    }

    /// Takes one watcher event and returns the objects whose rows are to be printed,
    /// in table order.
    ///
    /// A (re)list is buffered until `InitDone` so the first table is complete and
    /// sorted, and objects missing from a relist are forgotten (they were deleted
    /// while the watch was down).
    pub fn handle(&mut self, event: Event<K>) -> Vec<K> {
        match event {
            Event::Init => {
                self.relisting = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(object) => match self.relisting.as_mut() {
                Some(listed) => {
                    listed.insert(key(&object), object);
                    Vec::new()
                }
                // The watcher always sends Init first; without it, treat it as an update.
                None => self.update(object),
            },
            Event::InitDone => {
                let listed = self.relisting.take().unwrap_or_default();
                self.printed.retain(|key, _| listed.contains_key(key));
                self.objects = listed;
                self.synced = true;
                let view = self.view;
                let mut changed = Vec::new();
                for (key, object) in &self.objects {
                    let cells = row_cells(object, view);
                    if self.printed.get(key) != Some(&cells) {
                        self.printed.insert(key.clone(), cells);
                        changed.push(object.clone());
                    }
                }
                changed
            }
            Event::Apply(object) => self.update(object),
            Event::Delete(object) => {
                let key = key(&object);
                self.objects.remove(&key);
                self.printed.remove(&key);
                Vec::new()
            }
        }
    }

    fn update(&mut self, object: K) -> Vec<K> {
        let key = key(&object);
        let cells = row_cells(&object, self.view);
        self.objects.insert(key.clone(), object.clone());
        if self.printed.get(&key) == Some(&cells) {
            return Vec::new();
        }
        self.printed.insert(key, cells);
        vec![object]
    }

    /// True once the first full list arrived.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Objects currently known.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True when no object is known.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// The `--until-done` condition: the list is complete, holds at least one object,
    /// and every object has reached an end state.
    pub fn all_finished(&self) -> bool {
        self.synced && !self.objects.is_empty() && self.objects.values().all(K::finished)
    }

    /// `name (State)` of every unfinished object, for the timeout message.
    pub fn unfinished(&self) -> Vec<String> {
        self.objects
            .values()
            .filter(|object| !object.finished())
            .map(|object| format!("{} ({})", object.name_any(), object.state_label()))
            .collect()
    }
}

/// Turns the objects [`WatchState::handle`] returns into output lines.
#[derive(Debug)]
pub struct WatchPrinter {
    view: View,
    output: Option<OutputFormat>,
    /// Column widths, fixed by the first rows printed so later rows line up under them.
    widths: Option<Vec<usize>>,
}

impl WatchPrinter {
    /// A printer for `-o` `output` laid out as `view`.
    pub fn new(view: View, output: Option<OutputFormat>) -> Self {
        Self {
            view,
            output,
            widths: None,
        }
    }

    /// Lines for `objects`; the first non-empty call starts with the header.
    /// In JSON mode each object is one compact JSON line.
    pub fn lines<K: Listed>(
        &mut self,
        objects: &[K],
        now: Timestamp,
    ) -> Result<Vec<String>, CliError> {
        match &self.output {
            Some(OutputFormat::JsonPath(template)) => {
                return objects
                    .iter()
                    .map(|object| Ok(template.render(&serde_json::to_value(object)?)))
                    .collect();
            }
            Some(OutputFormat::Json) => {
                return objects
                    .iter()
                    .map(|object| serde_json::to_string(object).map_err(CliError::from))
                    .collect();
            }
            Some(OutputFormat::Yaml) => {
                return objects
                    .iter()
                    .map(|object| {
                        let document = yaml_serde::to_string(object)?;
                        Ok(format!("---\n{}", document.trim_end()))
                    })
                    .collect();
            }
            Some(OutputFormat::Name) => {
                return Ok(objects.iter().map(qualified_name).collect());
            }
            Some(OutputFormat::Wide) | None => {}
        }
        let rows: Vec<Vec<String>> = objects
            .iter()
            .map(|object| row(object, self.view, now))
            .collect();
        let mut lines = Vec::new();
        if rows.is_empty() {
            return Ok(lines);
        }
        let widths = match &self.widths {
            Some(widths) => widths.clone(),
            None => {
                let header = header_row::<K>(self.view);
                let mut all = vec![header.clone()];
                all.extend(rows.iter().cloned());
                let widths = column_widths(&all);
                lines.push(table_line(&header, &widths));
                self.widths = Some(widths.clone());
                widths
            }
        };
        lines.extend(rows.iter().map(|row| table_line(row, &widths)));
        Ok(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::tests::job;
    use trainyard_api::{QueueStatus, TrainingJob, TrainingJobState, TrainingJobStatus};

    fn with_state(mut job: TrainingJob, state: TrainingJobState, epoch: u32) -> TrainingJob {
        job.status = Some(TrainingJobStatus {
            state: Some(state),
            current_epoch: Some(epoch),
            total_epochs: Some(10),
            ..TrainingJobStatus::default()
        });
        job
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_010).expect("valid")
    }

    /// Feeds events through state and printer, returning every printed line.
    fn run(
        state: &mut WatchState<TrainingJob>,
        printer: &mut WatchPrinter,
        events: Vec<Event<TrainingJob>>,
    ) -> Vec<String> {
        events
            .into_iter()
            .flat_map(|event| {
                let objects = state.handle(event);
                printer.lines(&objects, now()).expect("renders")
            })
            .collect()
    }

    fn names(objects: &[TrainingJob]) -> Vec<String> {
        objects.iter().map(|o| o.name_any()).collect()
    }

    #[test]
    fn the_first_list_prints_a_table_then_only_changed_rows() {
        let view = View::default();
        let mut state = WatchState::new(view);
        let mut printer = WatchPrinter::new(view, None);
        let a = with_state(job("a", 1, 1), TrainingJobState::Queued, 0);
        let b = with_state(job("bert-distributed", 2, 2), TrainingJobState::Running, 3);
        let lines = run(
            &mut state,
            &mut printer,
            vec![
                Event::Init,
                Event::InitApply(b.clone()),
                Event::InitApply(a.clone()),
                Event::InitDone,
                // The same row again (e.g. a metrics update): nothing to print.
                Event::Apply(b.clone()),
                Event::Apply(with_state(b.clone(), TrainingJobState::Running, 4)),
                Event::Apply(with_state(a.clone(), TrainingJobState::Running, 0)),
            ],
        );
        assert_eq!(
            lines,
            [
                "NAME               STATE     PROGRESS   EPOCH   GPUS      QUEUE     RESTARTS   AGE",
                "a                  Queued    -          0/10    1 (1x1)   default   0          10s",
                "bert-distributed   Running   -          3/10    4 (2x2)   -         0          10s",
                "bert-distributed   Running   -          4/10    4 (2x2)   -         0          10s",
                "a                  Running   -          0/10    1 (1x1)   -         0          10s",
            ]
        );
        assert!(state.synced());
        assert_eq!(state.len(), 2);
    }

    #[test]
    fn nothing_prints_before_the_first_list_completes() {
        let mut state = WatchState::new(View::default());
        assert!(state.handle(Event::Init).is_empty());
        let queued = with_state(job("a", 1, 1), TrainingJobState::Queued, 0);
        assert!(state.handle(Event::InitApply(queued)).is_empty());
        assert!(!state.synced());
        assert!(!state.all_finished());
        assert_eq!(names(&state.handle(Event::InitDone)), ["a"]);
    }

    #[test]
    fn a_relist_prints_only_what_changed_and_forgets_deleted_objects() {
        let mut state = WatchState::new(View::default());
        let a = with_state(job("a", 1, 1), TrainingJobState::Running, 1);
        let b = with_state(job("b", 1, 1), TrainingJobState::Running, 1);
        state.handle(Event::Init);
        state.handle(Event::InitApply(a.clone()));
        state.handle(Event::InitApply(b.clone()));
        assert_eq!(names(&state.handle(Event::InitDone)), ["a", "b"]);

        // The watch reconnects; b vanished meanwhile and a moved on.
        state.handle(Event::Init);
        let a2 = with_state(a, TrainingJobState::Running, 2);
        state.handle(Event::InitApply(a2));
        assert_eq!(names(&state.handle(Event::InitDone)), ["a"]);
        assert_eq!(state.len(), 1);

        // b comes back unchanged: it was forgotten, so it prints again.
        assert_eq!(names(&state.handle(Event::Apply(b))), ["b"]);
    }

    #[test]
    fn deletes_print_nothing_and_leave_scope() {
        let mut state = WatchState::new(View::default());
        let done = with_state(job("done", 1, 1), TrainingJobState::Completed, 10);
        let running = with_state(job("running", 1, 1), TrainingJobState::Running, 2);
        state.handle(Event::Init);
        state.handle(Event::InitApply(done));
        state.handle(Event::InitApply(running.clone()));
        state.handle(Event::InitDone);
        assert!(!state.all_finished());
        assert_eq!(state.unfinished(), ["running (Running)"]);
        assert!(state.handle(Event::Delete(running)).is_empty());
        assert!(state.all_finished());
    }

    #[test]
    fn until_done_needs_at_least_one_job_and_all_terminal() {
        let mut state = WatchState::new(View::default());
        state.handle(Event::Init);
        state.handle(Event::InitDone);
        assert!(state.synced() && state.is_empty());
        assert!(!state.all_finished(), "an empty namespace is not done");

        let a = with_state(job("a", 1, 1), TrainingJobState::Running, 9);
        let b = with_state(job("b", 1, 1), TrainingJobState::Queued, 0);
        state.handle(Event::Apply(a.clone()));
        state.handle(Event::Apply(b.clone()));
        assert!(!state.all_finished());
        state.handle(Event::Apply(with_state(a, TrainingJobState::Completed, 10)));
        assert!(!state.all_finished());
        assert_eq!(state.unfinished(), ["b (Queued)"]);
        state.handle(Event::Apply(with_state(b, TrainingJobState::Failed, 0)));
        assert!(state.all_finished());
        assert!(state.unfinished().is_empty());
    }

    #[test]
    fn queue_position_changes_are_rows_but_age_is_not() {
        let mut state = WatchState::new(View::default());
        state.handle(Event::Init);
        state.handle(Event::InitDone);
        let waiting = |position: u32| {
            let mut j = with_state(job("w", 1, 1), TrainingJobState::Queued, 0);
            if let Some(status) = j.status.as_mut() {
                status.queue = Some(QueueStatus {
                    name: "default".into(),
                    position: Some(position),
                    reason: Some("8 of 8 GPUs in use".into()),
                });
            }
            j
        };
        assert_eq!(state.handle(Event::Apply(waiting(3))).len(), 1);
        assert_eq!(state.handle(Event::Apply(waiting(3))).len(), 0);
        let mut older = waiting(3);
        older.metadata.creation_timestamp = None;
        assert_eq!(
            state.handle(Event::Apply(older)).len(),
            0,
            "AGE alone is no change"
        );
        assert_eq!(state.handle(Event::Apply(waiting(2))).len(), 1);
    }

    #[test]
    fn later_rows_keep_the_first_widths_and_json_prints_objects() {
        let view = View {
            namespace_column: true,
            wide: false,
        };
        let mut printer = WatchPrinter::new(view, None);
        let first = printer.lines(&[job("a", 1, 1)], now()).expect("renders");
        assert_eq!(first.len(), 2, "header and row");
        assert!(
            first[0].starts_with("NAMESPACE   NAME   STATE"),
            "{first:?}"
        );
        let later = printer
            .lines(&[job("a-much-longer-name", 1, 1)], now())
            .expect("renders");
        assert_eq!(later.len(), 1, "no second header");
        assert!(
            later[0].starts_with("ml          a-much-longer-name   -"),
            "{later:?}"
        );
        assert!(
            printer
                .lines::<TrainingJob>(&[], now())
                .expect("renders")
                .is_empty()
        );

        let mut json = WatchPrinter::new(view, Some(OutputFormat::Json));
        let lines = json.lines(&[job("a", 1, 1)], now()).expect("renders");
        let parsed: TrainingJob = serde_json::from_str(&lines[0]).expect("one object per line");
        assert_eq!(parsed.name_any(), "a");

        let template = crate::jsonpath::Template::parse("{.metadata.name}={.spec.numWorkers}")
            .expect("parses");
        let mut templated = WatchPrinter::new(view, Some(OutputFormat::JsonPath(template)));
        let lines = templated
            .lines(&[job("a", 1, 1), job("b", 2, 1)], now())
            .expect("renders");
        assert_eq!(lines, ["a=1", "b=2"], "each changed object on a line");
    }

    #[test]
    fn init_apply_without_init_counts_as_an_update() {
        let mut state = WatchState::new(View::default());
        assert_eq!(
            names(&state.handle(Event::InitApply(job("a", 1, 1)))),
            ["a"]
        );
    }
}
