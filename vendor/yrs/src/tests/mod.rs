mod compatibility_tests;
mod edit_traces;
mod edit_traces_tests;
