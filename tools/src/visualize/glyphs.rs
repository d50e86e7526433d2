//! The PNG drawing surface: plotters' bitmap backend with its text drawn glyph by glyph from
//! DejaVu Sans's own metrics. plotters' ab_glyph text drops each glyph's left side bearing,
//! which pulls a narrow glyph (a `1`, an `i`) against the one before it and leaves a gap after
//! it: `step1 000`. Everything but text goes straight to the bitmap backend.

use ab_glyph::{point, Font, FontRef, PxScale, ScaleFont};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind, FontTransform,
};
use std::sync::OnceLock;

/// DejaVu Sans, parsed once; `None` if the embedded bytes do not parse (a bug).
pub(crate) fn font() -> Option<&'static FontRef<'static>> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    FONT.get_or_init(|| FontRef::try_from_slice(dejavu::sans::regular()).ok()).as_ref()
}

/// The advance width in pixels of `text` at `size` pixels (plotters' size: the line height),
/// for laying out before anything is drawn; 0.6 of the size a character if the font is
/// missing.
pub(crate) fn text_width(text: &str, size: f64) -> f64 {
    let Some(font) = font() else { return text.chars().count() as f64 * size * 0.6 };
    let font = font.as_scaled(PxScale::from(size as f32));
    let mut prev = None;
    let mut width = 0.0f32;
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(p) = prev {
            width += font.kern(p, id);
        }
        width += font.h_advance(id);
        prev = Some(id);
    }
    width as f64
}

/// A bitmap backend that lays text out itself.
pub(crate) struct Canvas<'a> {
    inner: BitMapBackend<'a>,
    font: &'static FontRef<'static>,
}

impl<'a> Canvas<'a> {
    pub(crate) fn new(inner: BitMapBackend<'a>, font: &'static FontRef<'static>) -> Canvas<'a> {
        Canvas { inner, font }
    }

    /// The glyphs of `text` at `size` pixels (plotters' size: the font's line height), placed
    /// from x = 0 on a baseline at y = 0, and the advance width of the whole.
    fn layout(&self, text: &str, size: f64) -> (Vec<ab_glyph::Glyph>, f32) {
        let scale = PxScale::from(size as f32);
        let font = self.font.as_scaled(scale);
        let mut caret = 0.0f32;
        let mut prev = None;
        let mut glyphs = Vec::with_capacity(text.len());
        for c in text.chars() {
            let id = font.glyph_id(c);
            if let Some(p) = prev {
                caret += font.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(scale, point(caret, 0.0)));
            caret += font.h_advance(id);
            prev = Some(id);
        }
        (glyphs, caret)
    }
}

type Error = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

impl DrawingBackend for Canvas<'_> {
    type ErrorType = Error;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(&mut self, pos: BackendCoord, size: (u32, u32), src: &[u8]) -> Result<(), DrawingErrorKind<Error>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Error>> {
        let (_, width) = self.layout(text, style.size());
        Ok((width.ceil() as u32, style.size().ceil() as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Error>> {
        // Turned text (the prof charts' axis descriptions; none of the timeline's) keeps plotters' own
        // drawing.
        if !matches!(style.transform(), FontTransform::None) {
            return self.inner.draw_text(text, style, pos);
        }
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let (glyphs, width) = self.layout(text, style.size());
        let font = self.font.as_scaled(PxScale::from(style.size() as f32));
        let height = font.ascent() - font.descent();
        let anchor = style.anchor();
        let left = pos.0 as f32
            - match anchor.h_pos {
                HPos::Left => 0.0,
                HPos::Center => width / 2.0,
                HPos::Right => width,
            };
        let top = pos.1 as f32
            - match anchor.v_pos {
                VPos::Top => 0.0,
                VPos::Center => height / 2.0,
                VPos::Bottom => height,
            };
        let baseline = (top + font.ascent()).round();
        let (w, h) = self.get_size();
        let mut result = Ok(());
        for mut glyph in glyphs {
            glyph.position = point(left + glyph.position.x, baseline);
            let Some(outline) = self.font.outline_glyph(glyph) else { continue };
            let bounds = outline.px_bounds();
            let inner = &mut self.inner;
            outline.draw(|x, y, coverage| {
                let (x, y) = (bounds.min.x as i32 + x as i32, bounds.min.y as i32 + y as i32);
                if coverage <= 0.0 || x < 0 || y < 0 || x >= w as i32 || y >= h as i32 || result.is_err() {
                    return;
                }
                let alpha = color.alpha * coverage.min(1.0) as f64;
                result = inner.draw_pixel((x, y), BackendColor { alpha, rgb: color.rgb });
            });
            if result.is_err() {
                break;
            }
        }
        result
    }
}
