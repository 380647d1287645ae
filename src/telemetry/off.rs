//! Without the cargo feature `otel`: no spans, nothing captured.

use std::collections::BTreeMap;

use super::Handled;
use crate::config::TagSource;
use crate::event::OutboundEvent;
use crate::publisher::SendOutcome;

/// The caller's current trace context: none without the feature `otel`.
pub fn current_trace_context() -> Option<(String, Option<String>)> {
    None
}

pub(crate) struct PublishSpans;

impl PublishSpans {
    #[inline]
    pub(crate) fn start(_events: &[OutboundEvent], _tag_source: TagSource) -> PublishSpans {
        PublishSpans
    }

    #[inline]
    pub(crate) fn end(self, _outcomes: &[SendOutcome]) {}
}

pub(crate) struct ProcessSpans;

impl ProcessSpans {
    #[inline]
    pub(crate) fn start<'a>(
        _messages: impl Iterator<Item = (&'a BTreeMap<String, String>, &'a str)>,
        _group: &str,
    ) -> ProcessSpans {
        ProcessSpans
    }

    #[inline]
    pub(crate) fn inbox(&self, _i: usize, _new: bool) {}

    #[inline]
    pub(crate) fn enter(&self, _i: usize) {}

    #[inline]
    pub(crate) fn end(self, _how: Handled<'_>) {}
}
