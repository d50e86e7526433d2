//! Attributes the op does not take, of the wrong kind, or missing.

fn main() {
    gt_macros::gt! {
        %s = sum %x axis=[1];
        %r = randn f32[2] seed=1.5;
        %t = transpose %x dim0=[0];
        %u = unsqueeze %x;
    }
}
