//! `.gtir` script statements are not instructions, and `fused` kernels are the runtime's.

fn main() {
    gt_macros::gt! {
        %h = relu %x;
        print %h;
        repeat 3 { %g = neg %h };
        free %h;
        %k = fused %h : f32[2] kernel map [2] { };
    }
}
