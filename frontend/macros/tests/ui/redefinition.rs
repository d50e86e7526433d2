//! A value is defined once in a `gt!`.

fn main() {
    gt_macros::gt! {
        %h = relu %x;
        %y = neg %h;
        %h = exp %y;
        %a, %a = split %y size=1;
    }
}
