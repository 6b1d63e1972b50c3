//! The query service: the decision tables registered in one DataFusion context, the named
//! reports that answer "which limits were wrong?", and the read-only HTTP and PostgreSQL-wire
//! front ends.
