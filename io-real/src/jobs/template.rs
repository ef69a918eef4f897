//! Nomad's `api.Template` (a task's `template` block) in the job JSON.

use drover_core::structs::{TEMPLATE_DEFAULT_PERMS, TEMPLATE_DEFAULT_SPLAY, Template};
use serde::{Deserialize, Serialize};

use super::{duration, nanos};

/// `Splay` in nanoseconds; unset fields take Nomad's defaults (`restart`, 5 s, `"0644"`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ApiTemplate {
    pub source_path: Option<String>,
    pub dest_path: Option<String>,
    pub embedded_tmpl: Option<String>,
    pub change_mode: Option<String>,
    pub change_signal: Option<String>,
    pub splay: Option<i64>,
    pub perms: Option<String>,
    pub envvars: Option<bool>,
    pub left_delim: Option<String>,
    pub right_delim: Option<String>,
}

impl ApiTemplate {
    pub fn to_template(&self, problems: &mut Vec<String>) -> Template {
        let defaults = Template::default();
        let text = |value: &Option<String>| value.clone().unwrap_or_default();
        Template {
            source_path: text(&self.source_path),
            dest_path: text(&self.dest_path),
            embedded_tmpl: text(&self.embedded_tmpl),
            change_mode: self
                .change_mode
                .clone()
                .filter(|mode| !mode.is_empty())
                .unwrap_or(defaults.change_mode),
            // Nomad upper-cases the signal name (`Template.Canonicalize`).
            change_signal: text(&self.change_signal).to_ascii_uppercase(),
            splay: self.splay.map_or(TEMPLATE_DEFAULT_SPLAY, |splay| {
                duration("template splay", splay, problems)
            }),
            perms: self
                .perms
                .clone()
                .filter(|perms| !perms.is_empty())
                .unwrap_or_else(|| TEMPLATE_DEFAULT_PERMS.into()),
            envvars: self.envvars.unwrap_or(false),
            left_delim: self
                .left_delim
                .clone()
                .filter(|d| !d.is_empty())
                .unwrap_or(defaults.left_delim),
            right_delim: self
                .right_delim
                .clone()
                .filter(|d| !d.is_empty())
                .unwrap_or(defaults.right_delim),
        }
    }

    pub fn from_template(template: &Template) -> ApiTemplate {
        ApiTemplate {
            source_path: Some(template.source_path.clone()),
            dest_path: Some(template.dest_path.clone()),
            embedded_tmpl: Some(template.embedded_tmpl.clone()),
            change_mode: Some(template.change_mode.clone()),
            change_signal: Some(template.change_signal.clone()),
            splay: Some(nanos(template.splay)),
            perms: Some(template.perms.clone()),
            envvars: Some(template.envvars),
            left_delim: Some(template.left_delim.clone()),
            right_delim: Some(template.right_delim.clone()),
        }
    }
}
