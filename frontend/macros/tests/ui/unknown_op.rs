//! Unknown ops, with the `.gtir` parser's suggestion.

fn main() {
    gt_macros::gt! {
        %h = relu %x;
        %y = ad %h, 1;
        %z = frobnicate %h;
    }
}
