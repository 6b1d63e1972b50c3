//! The `verdict` command's tests, in one binary (one link of the workspace rather than
//! one per file): each module runs the built `verdict` as an operator would.

mod cli_output;
mod end_to_end;
mod gateway_policy_cache;
mod import_envoy;
mod jobs_cli;
mod policy_commands;
