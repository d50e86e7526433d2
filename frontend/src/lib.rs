//! gt-frontend: the .gtir script runner (Tensor API, autograd and gt! grow here).
