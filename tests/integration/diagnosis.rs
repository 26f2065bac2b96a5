//! (issue 14: to be written)
