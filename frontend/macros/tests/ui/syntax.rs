//! Syntax errors: a missing `=`, operands, numbers, types and `{..}` out of place.

fn main() {
    gt_macros::gt! {
        %y relu %x;
        %m = matmul %x;
        %w = matmul %x, {2.0};
        %t = tensor f32[2] [1, 2, 3];
        %z = zeros f32[-1];
        %v = mul %x, (2);
        %c = mul %x, lr;
        %q = zeros f33[2];
        %b = add %x, %y
    }
}
